"""Learning rate across devices: the linear scaling rule with a linear warmup.

Goyal et al. 2017 ("Accurate, Large Minibatch SGD"): when the global batch grows k-fold, grow
the learning rate k-fold too, but reach it gradually, because a large rate on a fresh model
diverges. The same formula serves the manual loop (Python numbers) and Keras (tensors).
"""

import tensorflow as tf


def warmup_steps(warmup_epochs: float, steps_per_epoch: int) -> int:
    return int(round(warmup_epochs * steps_per_epoch))


def learning_rate(step, base_lr: float, peak_lr: float, warmup: int):
    """``base_lr`` at step 0, rising linearly to ``peak_lr`` at step ``warmup``, then flat."""
    if peak_lr == base_lr or warmup <= 0:
        return peak_lr if isinstance(step, int) else tf.constant(peak_lr)
    if isinstance(step, int):
        return base_lr + (peak_lr - base_lr) * min(1.0, step / warmup)
    fraction = tf.minimum(1.0, tf.cast(step, tf.float32) / warmup)
    return base_lr + (peak_lr - base_lr) * fraction
