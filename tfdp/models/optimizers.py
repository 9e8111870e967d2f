"""``--optimizer``: Keras 3's optimizers, each update written out for the from-scratch steps,
so the from-scratch path and Keras ``fit`` train the same model from the same flags.

Each step, for every trainable variable ``w`` with gradient ``g`` at learning rate ``lr``
(the step count ``t`` counting from 1), after decoupled weight decay
(``w -= w * weight_decay * lr``, every trainable variable, as Keras' optimizers do):

* ``sgd`` (the textbook's): ``w -= lr * g``; with momentum ``v = momentum * v - lr * g`` then
  ``w += v`` (Nesterov: ``w += momentum * v - lr * g``).
* ``adam``: ``m += (g - m)(1 - beta_1)``; ``v += (g² - v)(1 - beta_2)``;
  ``w -= m * lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) / (sqrt(v) + epsilon)``.
* ``adamw``: ``adam`` whose weight decay is on by default (Keras' 0.004).
* ``rmsprop``: ``v = rho * v + (1 - rho) g²``; ``step = lr * g / sqrt(v + epsilon)``;
  ``w -= step`` (with momentum ``m = momentum * m + step`` then ``w -= m``).
* ``lion``: ``w -= lr * sign(beta_1 * m + (1 - beta_1) g)``; ``m = beta_2 * m + (1 - beta_2) g``.

Each expression is Keras' own, down to which constants Keras casts through float32 (``cast``)
and which it takes in the variable's dtype (``constant``): float64 runs of both paths agree
to rounding. The slots (``m``, ``v``) are variables beside each parameter, on each replica:
every replica applies the same summed gradient, so every replica's slots stay equal, like its
parameters. A backup holds them (``TrainingState.slots``), in Keras' order: each kind of slot
for every trainable variable, one kind after the other (``slot_kinds``). The step count is the
global step, which a backup holds anyway.

``tfdp.config.optimizer_spec.OPTIMIZERS`` declares them once, with their Keras class, defaults and
the flags each takes: the config's checks, its help, this module and the docs read it.
(TensorFlow is imported where an update is made: the config reads this module's settings
before anything starts TensorFlow.)
"""

import dataclasses

import numpy as np

from tfdp.config.optimizer_spec import HYPERPARAMETERS, OPTIMIZERS, takes


def _cast(value, dtype):
    """A Python float as Keras' ``ops.cast`` makes it: through float32."""
    import tensorflow as tf

    return tf.cast(value, dtype)


def _constant(value, dtype):
    """A Python float as Keras' arithmetic takes it beside a tensor: in the tensor's dtype."""
    import tensorflow as tf

    return tf.constant(value, dtype)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """The optimizer of a run (``of(config)``): its name, hyperparameters and weight decay;
    ``slots`` makes a replica's slot variables, ``update`` applies one step to one variable."""
    name: str = "sgd"
    momentum: float = 0.0
    nesterov: bool = False
    beta_1: float = None
    beta_2: float = None
    rho: float = None
    epsilon: float = None
    weight_decay: float = 0.0

    @classmethod
    def of(cls, config) -> "Optimizer":
        return cls(config.optimizer, config.momentum or 0.0, bool(config.nesterov),
                   config.beta_1, config.beta_2, config.rho, config.epsilon,
                   config.weight_decay or 0.0)

    @classmethod
    def of_keras(cls, optimizer) -> "Optimizer":
        """The kind (and momentum) of a Keras optimizer of one of ``OPTIMIZERS``' classes:
        enough to name its slots."""
        names = {kind.keras_class: name for name, kind in OPTIMIZERS.items()}
        name = next(names[k.__name__] for k in type(optimizer).__mro__ if k.__name__ in names)
        return cls(name, momentum=float(getattr(optimizer, "momentum", 0.0) or 0.0))

    @property
    def slot_kinds(self) -> tuple:
        """The kinds of slot every trainable variable has, in Keras' order (its optimizer's
        attribute names)."""
        return {"sgd": ("momentums",) if self.momentum else (),
                "adam": ("_momentums", "_velocities"),
                "adamw": ("_momentums", "_velocities"),
                "rmsprop": ("_velocities",) + (("_momentums",) if self.momentum else ()),
                "lion": ("_momentums",)}[self.name]

    def slots(self, params: dict, values: list = None) -> dict:
        """{parameter name: its slot variables} beside it (zeros, or ``values`` when resuming:
        one kind after the other, as ``slot_kinds``); empty for plain SGD. Call on the
        replica's device."""
        import tensorflow as tf

        kinds = self.slot_kinds
        if not kinds:
            return {}
        n = len(params)
        values = values or [np.zeros(v.shape, v.dtype.as_numpy_dtype)
                            for _ in kinds for v in params.values()]
        return {name: tuple(tf.Variable(values[k * n + i], trainable=False,
                                        name=f"{kind.strip('_')}_{name}")
                            for k, kind in enumerate(kinds))
                for i, name in enumerate(params)}

    def keras(self, learning_rate, **common):
        """Keras' own optimizer of these settings (``common``: EMA and the like)."""
        import keras

        kwargs = {flag: getattr(self, flag) for flag in HYPERPARAMETERS if takes(self.name, flag)}
        kind = getattr(keras.optimizers, OPTIMIZERS[self.name].keras_class)
        return kind(learning_rate, weight_decay=self.weight_decay or (
            0.0 if self.name == "adamw" else None), **kwargs, **common)

    def update(self, var, grad, lr, slots: tuple = (), step=None):
        """Apply one step to ``var`` with its ``slots`` at the step count ``step`` (the global
        step before this one, an int64 tensor); returns the last assignment."""
        import tensorflow as tf

        dtype = var.dtype
        lr, grad = tf.cast(lr, dtype), tf.cast(grad, dtype)
        if self.weight_decay:
            # assign_sub, not assign(var - ...): on a parameter server another worker's update
            # landing in between stays (the decay is read a moment early, never overwritten).
            var.assign_sub(var * _cast(self.weight_decay, dtype) * lr)
        return getattr(self, f"_{self.name}")(var, grad, lr, slots, step)

    def _sgd(self, var, grad, lr, slots, step):
        if not slots:
            return var.assign_sub(lr * grad)
        velocity, = slots
        momentum = _cast(self.momentum, var.dtype)
        velocity.assign(velocity * momentum - grad * lr)
        return var.assign_add(velocity * momentum - grad * lr if self.nesterov else velocity)

    def _adam(self, var, grad, lr, slots, step):
        import tensorflow as tf

        dtype = var.dtype
        m, v = slots
        t = tf.cast(step + 1, dtype)
        beta_1_power = tf.pow(_cast(self.beta_1, dtype), t)
        beta_2_power = tf.pow(_cast(self.beta_2, dtype), t)
        alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        m.assign_add((grad - m) * _constant(1 - self.beta_1, dtype))
        v.assign_add((tf.square(grad) - v) * _constant(1 - self.beta_2, dtype))
        return var.assign_sub((m * alpha) / (tf.sqrt(v) + _constant(self.epsilon, dtype)))

    _adamw = _adam  # AdamW is Adam; only its weight decay's default differs.

    def _rmsprop(self, var, grad, lr, slots, step):
        import tensorflow as tf

        dtype = var.dtype
        velocity, *momentum = slots
        rho = _constant(self.rho, dtype)
        velocity.assign(rho * velocity + _constant(1 - self.rho, dtype) * tf.square(grad))
        increment = lr * grad / tf.sqrt(velocity + _constant(self.epsilon, dtype))
        if not momentum:
            return var.assign_sub(increment)
        momentum[0].assign(_constant(self.momentum, dtype) * momentum[0] + increment)
        return var.assign_sub(momentum[0])

    def _lion(self, var, grad, lr, slots, step):
        import tensorflow as tf

        dtype = var.dtype
        m, = slots
        beta_1, beta_2 = _cast(self.beta_1, dtype), _cast(self.beta_2, dtype)
        var.assign_sub(lr * tf.sign(m * beta_1 + grad * (1.0 - beta_1)))
        return m.assign(m * beta_2 + grad * (1.0 - beta_2))
