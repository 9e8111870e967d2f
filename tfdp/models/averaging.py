"""Weight averaging (``--ema``) as Keras 3's optimizers compute it (``use_ema``,
``ema_momentum``), written out for the from-scratch steps.

After every step, each trainable parameter ``w`` moves its average ``a``:
``a = m * a + (1 - m) * w``, except that the first step of a run sets ``a = w`` (Keras: while
its step counter is 0). What is evaluated and exported is the average; training goes on from
the live weights. Batch normalization's running statistics are not averaged (Keras averages
the trainable variables only). Like the optimizer's slots, each replica keeps its own averages, equal
on every replica, and a backup holds them.
"""

from typing import NamedTuple

import tensorflow as tf


class Averaging(NamedTuple):
    momentum: float = 0.0

    def averages(self, params: dict, slots: list = None) -> dict:
        """One average per trainable parameter, beside it (the parameter's value, or ``slots``
        when resuming); none when off. Call on the replica's device."""
        if not self.momentum:
            return {}
        values = slots or [v.numpy() for v in params.values()]
        return {name: tf.Variable(value, trainable=False, name=f"average_{name}")
                for name, value in zip(params, values)}

    def update(self, average: tf.Variable, var: tf.Variable, started):
        """Move ``average`` towards ``var`` after a step; ``started`` (a bool tensor): whether
        an earlier step has already set the averages."""
        # tf.constant, not tf.cast: a Python float cast to float64 passes through float32.
        momentum = tf.cast(started, var.dtype) * tf.constant(self.momentum, var.dtype)
        return average.assign(momentum * average + (1 - momentum) * var)


def averaged(params: dict, averages: dict) -> dict:
    """The model that is evaluated and exported: ``params`` with each averaged parameter's
    average in its place (all of them as they are when there are no averages)."""
    return {**params, **averages}
