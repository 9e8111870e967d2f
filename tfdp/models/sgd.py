"""SGD as Keras 3's ``keras.optimizers.SGD`` computes it, written out for the from-scratch
steps, so the from-scratch path and Keras ``fit`` train the same model from the same flags.

Each step, for every trainable variable ``w`` with gradient ``g`` at learning rate ``lr``:
decoupled weight decay first (``w -= w * weight_decay * lr``, every trainable variable, as
Keras' default), then

* plain SGD (``momentum`` 0): ``w -= lr * g``;
* momentum: ``v = momentum * v - lr * g``; ``w += v``;
* Nesterov: the same ``v``, then ``w += momentum * v - lr * g``.

The velocity ``v`` is a variable beside each parameter, on each replica: every replica applies
the same summed gradient, so every replica's velocities stay equal, like its parameters. A
backup holds them (``slots``), so a resumed run goes on with the same velocities.
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf


class SGD(NamedTuple):
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    @classmethod
    def of(cls, config) -> "SGD":
        return cls(config.momentum, bool(config.nesterov), config.weight_decay)

    def velocities(self, params: dict, slots: list = None) -> dict:
        """One velocity variable per parameter, beside it (zeros, or ``slots`` when resuming);
        none for plain SGD. Call on the replica's device."""
        if not self.momentum:
            return {}
        values = slots or [np.zeros(v.shape, v.dtype.as_numpy_dtype) for v in params.values()]
        return {name: tf.Variable(value, trainable=False, name=f"velocity_{name}")
                for name, value in zip(params, values)}

    def update(self, var: tf.Variable, grad, lr, velocity: tf.Variable = None):
        """Apply one step to ``var`` (its ``velocity`` with momentum); returns the last
        assignment (for control dependencies)."""
        dtype = var.dtype
        lr, grad = tf.cast(lr, dtype), tf.cast(grad, dtype)
        if self.weight_decay:
            var.assign(var - var * tf.cast(self.weight_decay, dtype) * lr)
        if velocity is None:
            return var.assign_sub(lr * grad)
        momentum = tf.cast(self.momentum, dtype)
        velocity.assign(velocity * momentum - grad * lr)
        return var.assign_add(velocity * momentum - grad * lr if self.nesterov else velocity)
