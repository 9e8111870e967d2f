"""Test loss and accuracy after every epoch, from one input iterator kept for the whole run.

Why not ``fit(validation_data=...)``: Keras (3.15) makes a new validation iterator every epoch
and drops the last one, and dropping a ``tf.data`` iterator waits for its autotuning thread to
wake (``gdb``: the main thread in ``RootDataset::Iterator::~Iterator``), which sleeps longer and
longer as training goes on. tfdp's own pipelines do not autotune (``tfdp/data/pipeline.py``), but under
MultiWorkerMirroredStrategy each worker's iterator is a ``MultiDeviceIterator`` whose
per-device datasets TF builds itself, autotuning on: seconds of every epoch (docs/benchmarks.md,
"Figures behind code comments"). Here the iterator is made once and lives as long as the run.

Each evaluation takes exactly ``steps`` batches of a repeated dataset: one pass over the same
test batches every epoch. Sums of loss, correct predictions and examples are all-reduced over
every replica of every worker, so all workers report the same global figures. A replica whose
shard is empty adds zeros without running the model.
"""

import contextlib

import keras
import numpy as np
import tensorflow as tf

from tfdp.models.loss import confusion_of, test_logits


class Evaluator:
    """``evaluate()`` -> (mean loss, accuracy, confusion matrix) over ``steps`` batches of
    ``distributed``, for a model of ``num_classes`` outputs."""

    def __init__(self, model, strategy, distributed, steps: int, eval_flip: bool = False,
                 num_classes: int = 10):
        self.model, self.strategy, self.steps = model, strategy, steps
        self.eval_flip, self.num_classes = eval_flip, num_classes
        self._distributed = distributed
        self._iterator = None
        self._step = tf.function(self._sums)

    def _sums(self, iterator):
        def sums(images, labels):
            logits = test_logits(lambda x: self.model(x, training=False), images,
                                 self.eval_flip)
            loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            return (tf.cast(tf.reduce_sum(loss), tf.float32),
                    tf.argmax(logits, axis=-1, output_type=labels.dtype))

        def replica(images, labels, *_):
            # An empty shard (a final batch smaller than the replica count) adds zeros and
            # never reaches a kernel: oneDNN's convolution refuses an empty batch.
            loss, predicted = tf.cond(tf.size(labels) > 0, lambda: sums(images, labels),
                                      lambda: (tf.zeros([]), tf.zeros([0], labels.dtype)))
            confusion = confusion_of(labels, predicted, self.num_classes, tf.float32)
            # One vector to reduce: the loss, the examples, the confusion matrix.
            return tf.concat([tf.stack([loss, tf.cast(tf.shape(labels)[0], tf.float32)]),
                              tf.reshape(confusion, [-1])], 0)

        return self.strategy.reduce("SUM", self.strategy.run(replica, args=next(iterator)),
                                    axis=None)

    def evaluate(self):
        if self._iterator is None:  # Made on first use, inside the run, once.
            self._iterator = iter(self._distributed)
        with averaged_weights(self.model, self.strategy):
            totals = sum(self._step(self._iterator).numpy().astype("float64")
                         for _ in range(self.steps))
        loss, examples = totals[:2]
        confusion = totals[2:].reshape(self.num_classes, self.num_classes).round().astype(np.int64)
        return loss / examples, np.trace(confusion) / examples, confusion


def averages_of(optimizer) -> list:
    """The weights' averages of an optimizer with ``use_ema`` (Keras keeps them in a private
    list, built with the optimizer), in the order of the model's trainable variables; none
    otherwise."""
    return list(getattr(optimizer, "_model_variables_moving_average", None) or [])


@contextlib.contextmanager
def averaged_weights(model, strategy):
    """Under ``--ema`` (the optimizer's ``use_ema``), the model holds its weights' averages
    while the block runs, as it will once ``fit`` ends; its live weights after it."""
    averages = averages_of(getattr(model, "optimizer", None))
    if not averages:
        yield
        return
    live = [v.numpy() for v in model.trainable_variables]
    with strategy.scope():
        for variable, average in zip(model.trainable_variables, averages):
            variable.assign(average)
    try:
        yield
    finally:
        with strategy.scope():
            for variable, value in zip(model.trainable_variables, live):
                variable.assign(value)
