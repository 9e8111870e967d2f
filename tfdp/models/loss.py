"""The loss and the count every step computes, written once: the from-scratch steps and
tfdp's Keras step (``tfdp.paths.keras.train_step``) call the same functions."""

import tensorflow as tf

from tfdp.data.pipeline import mirror


def cross_entropy(logits, labels, smoothing: float = 0.0):
    """Each example's softmax cross-entropy, against targets that put ``smoothing`` of their
    mass evenly on all classes (label smoothing; 0: the labels alone). The same value as
    Keras' ``CategoricalCrossentropy(label_smoothing=...)`` of the one-hot labels."""
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    if not smoothing:
        return losses
    # Against the uniform target, the cross-entropy is the mean of -log softmax.
    uniform = -tf.reduce_mean(tf.nn.log_softmax(logits), axis=-1)
    return (1 - smoothing) * losses + smoothing * uniform


def summed_cross_entropy(logits, labels, smoothing: float = 0.0):
    """``cross_entropy`` summed over the examples (the caller divides)."""
    return tf.reduce_sum(cross_entropy(logits, labels, smoothing))


def test_logits(logits_of, images, eval_flip: bool = False):
    """``logits_of(images)``, or with ``eval_flip`` the mean of the logits of the images and of
    their mirror images (test-time augmentation): what evaluation and the export compute."""
    if not eval_flip:
        return logits_of(images)
    return (logits_of(images) + logits_of(mirror(images))) / 2


def own_losses(losses, dtype):
    """A model's own losses (``model.losses``: regularizers, ``add_loss``) summed in ``dtype``,
    as Keras' ``compute_loss`` adds them to the loss; 0 for a model without them."""
    return tf.add_n([tf.zeros([], dtype)] + [tf.cast(loss, dtype) for loss in losses])


def confusion(logits, labels):
    """The confusion matrix of a batch, int64 [K, K]: row = the true class, column = the class
    the ``logits`` rank first (its trace counts the correct ones)."""
    return confusion_of(labels, tf.argmax(logits, -1), logits.shape[-1])


def confusion_of(labels, predicted, num_classes: int, dtype=tf.int64):
    """The confusion matrix [K, K] of ``predicted`` classes against ``labels``, counted in
    ``dtype``: one scatter (``tf.math.confusion_matrix`` builds some 50 ops of checks and casts
    around it, and tracing them took ten times as long: docs/design.md#tests). A label or class
    outside [0, K) fails on the CPU, as it does there."""
    pairs = tf.stack([tf.cast(labels, tf.int64), tf.cast(predicted, tf.int64)], axis=1)
    return tf.scatter_nd(pairs, tf.ones(tf.shape(pairs)[:1], dtype), [num_classes, num_classes])


def count_correct(logits, labels):
    """How many of ``labels`` the ``logits`` rank first, as an int64 scalar."""
    return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.int64))
