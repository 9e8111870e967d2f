"""The from-scratch step: the textbook's algorithm, one visible step at a time.

Every step: split the global batch across the devices; on each device, a forward and backward
pass of its own replica under its own ``GradientTape``, with the loss summed over its shard and
divided by the *global* batch size (so the per-device gradients add up to the gradient of the
mean loss); an allreduce sums the gradients; every replica applies the same SGD update and so
stays identical to the others. The step is compiled with ``tf.function`` unless ``eager``.
"""

import tensorflow as tf

from tfdp.manual.allreduce import ALLREDUCE
from tfdp.manual.feed import Feed, images_feed
from tfdp.models import lenet
from tfdp.models.loss import count_correct, summed_cross_entropy


def make_train_step(replicas: list, devices: list, allreduce: str, eager: bool = False,
                    feed: Feed = None, compute_dtype=None, allreduce_dtype=None):
    """``step(*batch, lr) -> (loss, correct)`` over the global batch, updating replicas. The
    batch is ``(images, labels)`` unless a ``feed`` says otherwise. ``compute_dtype``
    (default: the parameters') is what the forward and backward passes compute in;
    ``allreduce_dtype`` (default: the gradients') is what the gradients travel and are summed
    in, cast back before the update."""
    reduce = ALLREDUCE[allreduce]
    dtype = replicas[0]["W1"].dtype
    compute = tf.as_dtype(compute_dtype or dtype)
    travel = tf.as_dtype(allreduce_dtype or dtype)
    feed = feed or images_feed(devices)

    def step(*batch_and_lr):
        *batch, lr = batch_and_lr
        placed = feed.shards("train", *batch)
        n = tf.cast(tf.shape(batch[-1])[0], dtype)  # Labels, or indices: both one per example.
        grads, losses, correct = [], [], []
        for device, params, (x, y) in zip(devices, replicas, placed):
            with tf.device(device):
                loss, right, *g = _unless_empty(
                    y, lambda: _shard_gradients(params, x, y, n, compute),
                    lambda: [tf.zeros([], dtype), tf.zeros([], tf.int64),
                             *[tf.zeros_like(v) for v in params.values()]])
                grads.append(g)
                losses.append(loss)
                correct.append(right)
        if travel != dtype:
            grads = [_cast_on(device, g, travel) for device, g in zip(devices, grads)]
        summed = reduce(grads, devices)
        for device, params, g in zip(devices, replicas, summed):
            with tf.device(device):
                for var, grad in zip(params.values(), g):
                    var.assign_sub(tf.cast(lr, dtype) * tf.cast(grad, dtype))
        return tf.add_n(losses), tf.add_n(correct)

    if eager:
        return step
    return tf.function(step, input_signature=[*feed.signature, tf.TensorSpec([], tf.float32)])


def _cast_on(device, tensors, dtype) -> list:
    with tf.device(device):
        return [tf.cast(t, dtype) for t in tensors]


def _shard_gradients(params: dict, x, y, global_batch, compute):
    """One device's forward and backward pass: (loss share, correct, gradients)."""
    with tf.GradientTape() as tape:
        logits = lenet.logits(params, x, compute)
        loss = summed_cross_entropy(logits, y) / global_batch  # / global batch: grads add up
    return [loss, count_correct(logits, y), *tape.gradient(loss, list(params.values()))]


def make_eval_step(replicas: list, devices: list, eager: bool = False, feed: Feed = None,
                   compute_dtype=None):
    """``step(*batch) -> (summed loss, correct)``, the batch split like in training."""
    dtype = replicas[0]["W1"].dtype
    feed = feed or images_feed(devices)

    def shard_sums(params, x, y):
        logits = lenet.logits(params, x, compute_dtype)
        return [summed_cross_entropy(logits, y), count_correct(logits, y)]

    def step(*batch):
        losses, correct = [], []
        for device, params, (x, y) in zip(devices, replicas, feed.shards("test", *batch)):
            with tf.device(device):
                loss, right = _unless_empty(y, lambda: shard_sums(params, x, y),
                                            lambda: [tf.zeros([], dtype), tf.zeros([], tf.int64)])
                losses.append(loss)
                correct.append(right)
        return tf.add_n(losses), tf.add_n(correct)

    return step if eager else tf.function(step, input_signature=feed.signature)


def _unless_empty(labels, compute, zeros) -> list:
    """``compute()``, or ``zeros()`` when this device's shard is empty (a global batch smaller
    than the device count): an empty shard contributes nothing, and never reaches a kernel
    (oneDNN's convolution refuses an empty batch)."""
    return tf.cond(tf.size(labels) > 0, compute, zeros)
