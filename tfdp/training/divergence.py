"""A run whose training loss has left the numbers, or exploded, stops, and nothing is exported.

Every path asks the same question of the losses it reads: the from-scratch loop of every step's
loss, Keras' callback of the epoch's running mean every few steps (``exact=False``: the step
named is the one it looked at, so the line says "by").

Two ways to diverge: a loss that is not finite, and a finite loss that has exploded: more than
``EXPLODED`` times the larger of ln(10), the cross-entropy of a model that guesses uniformly
among Fashion-MNIST's ten classes, and the first loss this run read (unless that one had
already exploded). A mean cross-entropy of 230 means the batch's true classes were given
probabilities near e^-230 on average: no run that is still learning goes there (too large a
learning rate blows up in a few steps, to 1e29 and beyond), while a healthy run's loss stays
near its first (measured in docs/faults.md).
"""

import math

from tfdp.util.errors import Diverged

EXPLODED = 100
CHANCE_LOSS = math.log(10)


class Divergence:
    """The losses of one run, read in order."""

    def __init__(self):
        self.first = None

    def check(self, loss: float, step: int, steps_per_epoch: int, exact: bool = True) -> None:
        """Raise ``Diverged`` if ``loss``, read after global step ``step`` (counted from 1), is
        not finite or has exploded."""
        bar = max(self.first or 0.0, CHANCE_LOSS)
        # The first loss sets the bar unless it has exploded already (Keras reads a mean).
        if self.first is None and loss <= EXPLODED * bar:
            self.first = loss
        if not math.isfinite(loss) or loss > EXPLODED * bar:
            epoch, within = divmod(step - 1, steps_per_epoch)
            why = "" if not math.isfinite(loss) else (
                f", over {EXPLODED} times its first value and chance's ({bar:.2f})")
            raise Diverged(loss, epoch, within + 1, steps_per_epoch, exact=exact, why=why)
