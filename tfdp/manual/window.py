"""A window of from-scratch steps: ``count`` steps in one compiled call, a loop in the graph
that takes each batch from the input iterator and each step's learning rate from the plan. The
host issues one call per ``--sync_every`` steps and reads their losses together (section 12.2:
the host waits for the device once a window, not once a step)."""

import tensorflow as tf


def make_train_window(step, plan, eager: bool = False):
    """``window(batches, first_step, count) -> (losses, correct, examples, times)``:
    ``count`` calls of ``step`` on the next batches of the iterator ``batches``, global step
    ``first_step + i`` at the plan's learning rate of that step; one entry per step in each
    result."""
    def window(batches, first_step, count):
        losses = tf.TensorArray(tf.float64, size=count)  # Exact for float32 and float64.
        right = tf.TensorArray(tf.int64, size=count)
        examples = tf.TensorArray(tf.int32, size=count)
        arrivals = tf.TensorArray(tf.float64, size=count)
        for i in tf.range(count):
            batch = next(batches)
            lr = tf.cast(plan.learning_rate(first_step + tf.cast(i, tf.int64)), tf.float32)
            loss, correct, times = step(*batch, lr)
            losses = losses.write(i, tf.cast(loss, tf.float64))
            right = right.write(i, correct)
            examples = examples.write(i, tf.shape(batch[-1])[0])
            arrivals = arrivals.write(i, times)
        return losses.stack(), right.stack(), examples.stack(), arrivals.stack()

    return window if eager else tf.function(window)
