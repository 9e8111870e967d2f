"""Copy a model's parameters onto every device (with each replica's optimizer slots:
``Replicas``), and split a minibatch across the devices."""

import dataclasses

import tensorflow as tf

from tfdp.cluster.stall import read_after_a_loss
from tfdp.config.plan import shard_sizes
from tfdp.models.averaging import Averaging, averaged
from tfdp.models.optimizers import Optimizer
from tfdp.models.stateless import HandWrittenLeNet


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
    """The model on every device: each replica's variables (``params[d]``, the textbook's
    ``get_params``: every variable of the ``model``, ``tfdp.models.stateless``: its weights
    and its seed states), its optimizer's slots (``slots[d]``: {name: slot variables}) and
    its weight averages, the optimizer's step count (``iterations``, on the first device: the
    global step, which Adam's bias correction reads), whether a step has set the averages
    yet (``averaged``, a bool variable), and each replica's step marks (``marks[d]``: the
    global step its update began and the one it finished; equal, the replica holds that
    whole step, which a run that lost other replicas saves: ``survivor``)."""
    model: object
    devices: list
    params: list
    slots: list
    averages: list
    averaged: tf.Variable
    iterations: tf.Variable
    marks: list

    @classmethod
    def place(cls, params: dict, devices: list, optimizer: Optimizer = Optimizer(),
              averaging: Averaging = Averaging(), slots: list = None,
              averages: list = None, first_step: int = 0, model=None):
        """``params`` (numpy, by name) of ``model`` copied onto every device, with
        ``optimizer``'s zero slots (or ``slots``) and ``averaging``'s averages starting at the
        parameters (or ``averages``); ``first_step``: the global step a resumed run starts
        at (its averages came with the backup, so the first step does not reset them). The
        model is LeNet (or lenet_bn) unless given."""
        model = model or HandWrittenLeNet.of(params)
        replicas = replicate(params, devices)
        kept, means, marks = [], [], []
        for device, replica in zip(devices, replicas):
            trained = {name: replica[name] for name in model.trainable}
            with tf.device(device):
                kept.append(optimizer.slots(trained, slots))
                means.append(averaging.averages(trained, averages))
                marks.append(tuple(tf.Variable(first_step, dtype=tf.int64, trainable=False,
                                               name=name) for name in ("began", "finished")))
        with tf.device(devices[0]):
            averaged_yet = tf.Variable(first_step > 0, trainable=False, name="averaged")
            iterations = tf.Variable(first_step, dtype=tf.int64, trainable=False,
                                     name="iterations")
        return cls(model, devices, replicas, kept, means, averaged_yet, iterations, marks)

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

    def survivor(self, reachable: set) -> tuple:
        """``(d, step)``: the replica holding the newest whole step among those on the devices
        ``reachable``, its marks read once; ``(None, None)`` where none does (each began a
        step it did not finish, cut short mid-update, or could not be read)."""
        best = (None, None)
        for d, (began, finished) in enumerate(self.marks):
            if self.devices[d] in reachable:
                try:
                    began, finished = read_after_a_loss(
                        lambda b=began, f=finished: (int(b.numpy()), int(f.numpy())))
                except tf.errors.OpError:  # Its worker went while it was asked.
                    continue
                if began == finished and (best[1] is None or finished > best[1]):
                    best = (d, finished)
        return best
