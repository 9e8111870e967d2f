"""How fast each worker runs its steps (section 12.3 on the parameter-server path): stragglers
named, and a flight recorder for hangs.

Asynchronous SGD has no exchange for a slow worker to hold up: the coordinator gives each step
to whichever worker is free, so a slow worker takes fewer steps and its updates arrive staler.
What names it is its pace: every step returns the index of the worker that ran it and the Unix
times, on that worker's clock, at which the step started and at which its push had landed
(``tfdp.paths.parameter_server.step``). From those:

* per worker, each epoch: the steps it ran and its mean step time (pull, gradient, push) go
  into the epoch's record in ``metrics.json``;
* a **straggler**, a worker whose median step time is at least ``SLOW_FACTOR`` times the median
  of the other workers' and ``SLOW_MS`` ms more, is named (medians: on a busy machine one step
  slowed by another process moves the mean of a worker's few steps, and is not a straggler) in the epoch's line ("worker 1 takes
  38.0 ms a step, 3.1x the others' 12.2 ms; it ran 12% of the steps");
* the **flight recorder** keeps the last ``flight_recorder.KEPT`` steps' worker and times for
  the one-line error of a lost cluster (``tfdp.trace.flight_recorder``).
"""

import collections
import statistics

import numpy as np

from tfdp.trace import flight_recorder

SLOW_FACTOR = 1.5
SLOW_MS = 2.0


class WorkerPace(flight_recorder.FlightRecorder):
    describes = "step times per worker"

    def __init__(self, num_workers: int, run_dir: str):
        self.names = [f"worker {w}" for w in range(num_workers)]
        self.run_dir = run_dir
        self.kept = collections.deque(maxlen=flight_recorder.KEPT)
        self.epoch = []

    def add(self, step: int, worker: int, start: float, end: float) -> None:
        """Global step ``step`` ran on ``worker`` from ``start`` to ``end`` (Unix seconds)."""
        self.epoch.append((worker, (end - start) * 1e3))
        self.kept.append((step, worker, start, end))

    def epoch_figures(self) -> tuple:
        """(the record's per-worker figures, the epoch line's words), and a new epoch."""
        steps, self.epoch = self.epoch, []
        if not steps:
            return {}, ""
        workers = np.array([w for w, _ in steps])
        ms = np.array([m for _, m in steps])
        counts = np.bincount(workers, minlength=len(self.names))
        means = [float(ms[workers == w].mean()) if counts[w] else None
                 for w in range(len(self.names))]
        figures = {"worker_steps": counts.tolist(),
                   "worker_step_ms": [None if m is None else round(m, 3) for m in means],
                   "workers": self.names}
        medians = {w: float(np.median(ms[workers == w]))
                   for w in range(len(self.names)) if counts[w]}
        if len(medians) < 2:
            return figures, ""
        slowest = max(medians, key=medians.get)
        others = statistics.median(m for w, m in medians.items() if w != slowest)
        if medians[slowest] >= max(SLOW_FACTOR * others, others + SLOW_MS):
            return figures, (f"; straggler: {self.names[slowest]} takes {medians[slowest]:.1f} "
                             f"ms a step, {medians[slowest] / others:.1f}x the others' "
                             f"{others:.1f} ms; it ran {counts[slowest] / len(steps):.0%} of the "
                             "steps")
        return figures, ""

    def dump(self, why: str = "") -> str:
        """Write the last steps' workers and times to the flight recorder file; its path ('' when
        no step was read)."""
        if not self.kept:
            return ""
        return flight_recorder.write(self.run_dir, {
            "why": why, "note": "per step, the worker that ran it and the Unix times, on that "
            "worker's clock, at which it started and its push had landed; a worker missing "
            "from the last steps is one the coordinator stopped hearing from",
            "steps": [{"step": step, "worker": self.names[worker], "start_unix_s": start,
                       "end_unix_s": end, "ms": (end - start) * 1e3}
                      for step, worker, start, end in self.kept]})
