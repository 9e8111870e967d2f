"""How often a run backs up within an epoch: ``--backup_every``, in steps (``500``) or in time
(``90s``, ``10m``, ``2h``), or ``0`` for only at epochs' ends and preemptions. A hard stop
(``SIGKILL``, the out-of-memory killer, a node lost, a pod evicted past its grace period) then
loses at most that much training, not the epoch (docs/faults.md).

A backup is due at the first step boundary where the loop looks (between the from-scratch
path's calls; at ``fit``'s checks, every few steps) once the interval has passed since the last
backup or the run's start. Under MultiWorkerMirroredStrategy the workers' clocks differ, so they
agree (the Keras callback's all-reduce): all back up the same step when any finds one due.
"""

import time

from tfdp.config.checks import parse_interval


class BackupInterval:
    """``due(step)``: whether a backup is due at global step ``step``; ``saved(step)`` after
    one (within an epoch or at its end) restarts the interval."""

    def __init__(self, every: str, first_step: int = 0):
        self.steps, self.seconds = parse_interval(every)
        self.saved(first_step)

    def saved(self, step: int) -> None:
        self._step, self._time = step, time.monotonic()

    def due(self, step: int) -> bool:
        if step == self._step:
            return False
        if self.steps is not None:
            return step - self._step >= self.steps
        return self.seconds is not None and time.monotonic() - self._time >= self.seconds
