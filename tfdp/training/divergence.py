"""A run whose training loss has left the numbers stops, and nothing is exported.

Every path asks the same question of the losses it reads: the from-scratch loop of every step's
loss, Keras' callback of the epoch's running mean every few steps (``exact=False``: the step
named is the one it looked at, so the line says "by").
"""

import math

from tfdp.errors import Diverged


def check(loss: float, step: int, steps_per_epoch: int, exact: bool = True) -> None:
    """Raise ``Diverged`` if ``loss``, read after global step ``step`` (counted from 1), is not
    finite."""
    if not math.isfinite(loss):
        epoch, within = divmod(step - 1, steps_per_epoch)
        raise Diverged(loss, epoch, within + 1, steps_per_epoch, exact=exact)
