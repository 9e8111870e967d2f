"""Time to accuracy, measured the way MLPerf Training measures it.

The clock starts before the first training step's inputs are read: loading the data from disk,
compiling the step and every evaluation count, as MLPerf's ``run_start`` to ``run_stop`` do.
What comes before (Python's and TensorFlow's imports, making the devices or the strategy,
joining a cluster) is start-up, reported on its own (``startup_s`` in ``metrics.json``). Every
epoch's record holds the clock's reading at the end of its evaluation (``clock_s``), and with
``--target_accuracy`` the run stops at the first evaluation that reaches it.

A resumed run's clock goes on from the last recorded epoch's reading: the part of an
interrupted epoch trained before the interruption is not counted again, so a resumed run's
readings are not comparable with an uninterrupted one's (``metrics.json`` says ``resumed``).
"""

import os
import time
from typing import Optional


class Clock:
    def __init__(self, offset: float = 0.0):
        self.offset = offset  # The reading an interrupted run had reached.
        self._start = None
        self.startup = None

    def start(self) -> None:
        """Start the clock now, and note how long the process took to come here."""
        self._start = time.perf_counter()
        self.startup = _process_age()

    def reading(self) -> float:
        """Seconds on the clock."""
        return self.offset + (time.perf_counter() - self._start if self._start else 0.0)


def _process_age() -> Optional[float]:
    """Seconds since this process started (Linux: ``/proc``), or None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
