"""Copy parameters onto every device, and split a minibatch across the devices."""

import tensorflow as tf

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
