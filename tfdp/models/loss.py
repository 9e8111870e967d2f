"""The loss and the count every from-scratch-style step computes, written once."""

import tensorflow as tf


def summed_cross_entropy(logits, labels):
    """The softmax cross-entropy of every example, summed (the caller divides)."""
    return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))


def count_correct(logits, labels):
    """How many of ``labels`` the ``logits`` rank first, as an int64 scalar."""
    return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.int64))
