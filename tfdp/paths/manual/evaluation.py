"""The from-scratch path's evaluation step: the model as evaluated (``--ema``'s averages where
it has them) on every replica, the test batch split across the devices as in training."""

import tensorflow as tf

from tfdp.models.loss import confusion_of, summed_cross_entropy, test_logits
from tfdp.paths.manual.feed import EVAL, Feed, images_feed
from tfdp.paths.manual.replicate import Replicas
from tfdp.paths.manual.step import StepSettings, unless_empty


def make_eval_step(replicas: Replicas, settings: StepSettings = StepSettings(),
                   feed: Feed = None, split: str = EVAL):
    """``step(*batch) -> (summed loss, confusion matrix)`` of the model as evaluated
    (``Replicas.evaluated``) on a batch of ``split`` (the feed's ``EVAL`` or ``TEST``), split
    like in training; with ``settings.eval_flip`` the logits are the mean of each image's and
    its mirror image's."""
    dtype, model = replicas.dtype, replicas.model
    feed = feed or images_feed(replicas.devices)

    def shard_sums(params, x, y):
        logits = test_logits(lambda images: model.forward(params, images, training=False)[0],
                             x, settings.eval_flip)
        return [summed_cross_entropy(logits, y), tf.argmax(logits, -1)]

    def step(*batch):
        losses, confusions = [], []
        for device, params, (x, y) in zip(replicas.devices, replicas.evaluated(),
                                          feed.shards(split, *batch)):
            with tf.device(device):
                loss, predicted = unless_empty(y, lambda: shard_sums(params, x, y),
                                               lambda: [tf.zeros([], dtype),
                                                        tf.zeros([0], tf.int64)])
                losses.append(loss)
                confusions.append(confusion_of(y, predicted, model.num_classes))
        return tf.add_n(losses), tf.add_n(confusions)

    return step if settings.eager else tf.function(step, input_signature=feed.signature,
                                                   autograph=False)
