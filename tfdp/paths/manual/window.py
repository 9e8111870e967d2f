"""A window of from-scratch steps: ``count`` steps in one compiled call, a loop in the graph
that takes each batch from the input iterator and each step's learning rate from the plan. The
host issues one call per ``--sync_every`` steps and reads their losses together (section 12.2:
the host waits for the device once a window, not once a step).

Compiled without AutoGraph, as the steps are (``tfdp.paths.manual.step``): the loop is a
``tf.while_loop`` written out, and nothing else needs converting (docs/design.md#compiled-steps).
"""

import tensorflow as tf


def make_train_window(step, plan, eager: bool = False):
    """``window(batches, first_step, count) -> (losses, correct, examples, times)``:
    ``count`` calls of ``step`` on the next batches of the iterator ``batches``, global step
    ``first_step + i`` at the plan's learning rate of that step; one entry per step in each
    result."""
    def one_step(i, losses, right, examples, arrivals, batches, first_step):
        batch = next(batches)
        lr = tf.cast(plan.learning_rate(first_step + tf.cast(i, tf.int64)), tf.float32)
        loss, correct, times = step(*batch, lr)
        return (i + 1, losses.write(i, tf.cast(loss, tf.float64)), right.write(i, correct),
                examples.write(i, tf.shape(batch[-1])[0]), arrivals.write(i, times))

    def window(batches, first_step, count):
        results = (tf.TensorArray(tf.float64, size=count),  # Exact for float32 and float64.
                   tf.TensorArray(tf.int64, size=count), tf.TensorArray(tf.int32, size=count),
                   tf.TensorArray(tf.float64, size=count))
        _, *results = tf.while_loop(
            lambda i, *_: i < count,
            lambda i, *arrays: one_step(i, *arrays, batches, first_step),
            (tf.constant(0, count.dtype if isinstance(count, tf.Tensor) else tf.int32),
             *results))
        return tuple(r.stack() for r in results)

    return window if eager else tf.function(window, autograph=False)
