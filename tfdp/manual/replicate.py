"""Copy a model's parameters onto every device (with each replica's optimizer slots:
``Replicas``), and split a minibatch across the devices."""

import dataclasses

import tensorflow as tf

from tfdp.models.averaging import Averaging, averaged
from tfdp.models.sgd import SGD
from tfdp.models.stateless import HandWrittenLeNet
from tfdp.plan import shard_sizes


def get_params(params: dict, device: str) -> dict:
    """One replica: a ``tf.Variable`` on ``device`` for every parameter (the textbook's get_params)."""
    with tf.device(device):
        return {name: tf.Variable(value, name=name) for name, value in params.items()}


def replicate(params: dict, devices: list) -> list:
    """One replica per device, all starting from the same values."""
    return [get_params(params, device) for device in devices]


def split_batch(images: tf.Tensor, labels: tf.Tensor, devices: list) -> list:
    """Split a global batch into one ``(images, labels)`` shard per device, placed there.

    Shards differ in size by at most one example, so an odd final batch is trained on too.
    """
    sizes = tf.stack(shard_sizes(tf.shape(labels)[0], len(devices)))
    shards = zip(tf.split(images, sizes), tf.split(labels, sizes))
    placed = []
    for device, (x, y) in zip(devices, shards):
        with tf.device(device):
            placed.append((tf.identity(x), tf.identity(y)))
    return placed


@dataclasses.dataclass
class Replicas:
    """The model on every device: each replica's parameters (``params[d]``, the textbook's
    ``get_params``: every variable of the ``model``, ``tfdp.models.stateless``), its SGD
    velocities and its weight averages, and whether a step has set the averages yet
    (``averaged``, a bool variable)."""
    model: object
    devices: list
    params: list
    velocities: list
    averages: list
    averaged: tf.Variable

    @classmethod
    def place(cls, params: dict, devices: list, sgd: SGD = SGD(),
              averaging: Averaging = Averaging(), velocities: list = None,
              averages: list = None, resumed: bool = False, model=None):
        """``params`` (numpy, by name) of ``model`` copied onto every device, with ``sgd``'s
        zero velocities under momentum (or ``velocities``) and ``averaging``'s averages
        starting at the parameters (or ``averages``); ``resumed``: the averages came with a
        backup, so the first step does not reset them. The model is LeNet (or lenet_bn) unless
        given."""
        model = model or HandWrittenLeNet.of(params)
        replicas = replicate(params, devices)
        slots, means = [], []
        for device, replica in zip(devices, replicas):
            trained = {name: replica[name] for name in model.trainable}
            with tf.device(device):
                slots.append(sgd.velocities(trained, velocities))
                means.append(averaging.averages(trained, averages))
        with tf.device(devices[0]):
            averaged_yet = tf.Variable(resumed, trainable=False, name="averaged")
        return cls(model, devices, replicas, slots, means, averaged_yet)

    @property
    def dtype(self) -> tf.DType:
        """The parameters' dtype (float32 under mixed precision)."""
        return self.params[0][self.model.trainable[0]].dtype

    def trainable(self, d: int) -> dict:
        """Replica ``d``'s parameters that gradients train, by name."""
        return {name: self.params[d][name] for name in self.model.trainable}

    def evaluated(self) -> list:
        """Each replica's model as evaluated and exported: averaged under ``--ema``."""
        return [averaged(params, mine) for params, mine in zip(self.params, self.averages)]
