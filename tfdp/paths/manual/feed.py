"""Where the from-scratch steps' examples come from: a ``Feed``.

A batch is a tuple of tensors of the feed's ``signature``; ``shards(split, *batch)`` cuts it
into one ``(images, labels)`` pair per device, placed there. On one machine (``local_feed``)
the batches are the images themselves, cut with the textbook's ``split_batch``; across
machines (``tfdp.paths.manual.remote``) they are example indices into arrays each worker holds.
"""

from typing import Callable, NamedTuple

import tensorflow as tf

from tfdp.data import pipeline
from tfdp.paths.manual.replicate import split_batch

LABELS = tf.TensorSpec([None], tf.int64)


def images_spec(image_shape: tuple) -> tf.TensorSpec:
    """A batch of uint8 images of ``image_shape``."""
    return tf.TensorSpec([None, *image_shape], tf.uint8)


# What a batch is cut from (``shards``' first argument): the training split, the split
# evaluated after every epoch, and the test set evaluated once after training (the keys of
# ``tfdp.data.sources.DatasetInfo.uses``).
TRAIN, EVAL, TEST = "train", "eval", "test"


class Feed(NamedTuple):
    signature: list
    train_batches: Callable   # (first_epoch, offset) -> iterator over the remaining batches
    eval_batches: Callable    # () -> the batches evaluated after every epoch
    shards: Callable          # (TRAIN, EVAL or TEST, *batch) -> [(images, labels) per device]
    test_batches: Callable = None  # () -> the test set's batches, evaluated after training


def local_feed(config, plan, devices: list, train_split: pipeline.Split,
               eval_split: pipeline.Split, test_split: pipeline.Split = None) -> Feed:
    """Global batches of images from arrays in this process, split with ``split_batch``."""
    shape = train_split.images.shape[1:]
    shards = images_feed(devices, shape).shards

    def train_batches(first_epoch, offset):
        return iter(pipeline.train_batches(train_split, plan.global_batch, config.seed, first_epoch,
                                       config.epochs, plan.steps_per_epoch,
                                       config.augment == "flip").skip(offset))

    return Feed([images_spec(shape), LABELS], train_batches,
                lambda: pipeline.eval_batches(eval_split, plan.micro_batch, plan.eval_steps),
                shards,
                lambda: pipeline.eval_batches(test_split, plan.micro_batch, plan.eval_steps))


def images_feed(devices: list, image_shape: tuple = (28, 28, 1)) -> Feed:
    """Only the shape of a batch of images and how it is cut, for a step made without data
    (tests and benchmarks call the step on batches of their own: Fashion-MNIST's by default)."""
    return Feed([images_spec(image_shape), LABELS], None, None,
                lambda split, images, labels: split_batch(images, labels, devices))
