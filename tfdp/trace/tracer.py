"""``--trace_steps=A:B``: record global steps A to B (counted from 1) with TensorFlow's profiler,
then write their timeline (``tfdp.trace.timeline``) into the run folder.

Every loop asks its ``Tracer`` the same three things: how many steps it may run before the
traced range needs one step a call (``room``), to mark a step (``step``: the profiler starts
before the first traced step and stops after the last, and each traced step is delimited by a
``train`` marker, so its events are its own), and to finish (``finish``: also when the run ends
before B). Off (no ``--trace_steps``) it does nothing and costs nothing: no profiler is started,
and ``room`` never shortens a window.

Each process that runs the loop profiles itself and writes its part, ``trace/worker-<i>.json``;
the chief merges every part present into ``timeline.json`` and draws ``timeline.png``, waiting
up to ``MERGE_WAIT`` seconds for the other workers' parts (they finish their last traced step
at about the same time). The servers a chief drives (``servers``: the from-scratch path's
workers across machines, parameter servers and their workers) run no loop: the chief captures
their profiles (``tfdp.trace.server_capture``) and cuts them into steps by its own markers.
"""

import contextlib
import glob
import json
import logging
import os
import time

from tfdp.trace import timeline, timeline_png
from tfdp.trace.server_capture import ServerCapture, duration_ms

logger = logging.getLogger("tfdp")
MERGE_WAIT = 60


class Tracer:
    def __init__(self, steps, run_dir: str, worker: int = 0, workers: int = 1,
                 name: str = None, servers=()):
        self.first, self.last = steps or (None, None)
        self.run_dir, self.worker, self.workers = run_dir, worker, workers
        self.name = name or (f"worker {worker}" if workers > 1 else "chief")
        # A folder per worker: workers on one machine (or emulated hosts, which share its host
        # name) would otherwise write one file, <host>.xplane.pb, in the same second's folder.
        self.capture_dir = os.path.join(run_dir, "tensorboard",
                                        *([f"worker-{worker}"] if workers > 1 else []))
        self.started = self.finished = False
        self.servers = ServerCapture(servers, os.path.join(run_dir, "tensorboard"))
        # (time, steps issued) at the second room(), once the first call has compiled the step.
        # The loop finishes the steps in flight before the first traced one, so the time since,
        # over the steps issued since, is their pace (never less): how long the servers record.
        self.paced, self.rooms = None, 0

    @property
    def on(self) -> bool:
        return self.first is not None and not self.finished

    def covers(self, step: int) -> bool:
        """Whether global step ``step`` (from 1) is traced."""
        return self.on and self.first <= step <= self.last

    def room(self, done: int) -> int:
        """How many steps after global step ``done`` may run in one call: up to the traced
        range, then one at a time through it; unbounded when off or past it."""
        if not self.on or done >= self.last:
            return 1 << 62
        self.rooms += 1
        if self.rooms == 2:
            self.paced = time.monotonic(), done
        return 1 if done + 1 >= self.first else self.first - 1 - done

    @contextlib.contextmanager
    def step(self, step: int):
        """Around everything global step ``step`` does, when it is traced."""
        if not self.covers(step):
            yield
            return
        import tensorflow as tf

        if not self.started:
            # The servers record for a fixed time, which starts once this process records.
            tf.profiler.experimental.start(self.capture_dir)
            if self.servers.servers:
                self.servers.start(duration_ms(self._seconds_per_step(step - 1),
                                               self.last - self.first + 1))
            self.started = True
        with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
            yield
        if step == self.last:
            self.finish()

    def finish(self) -> None:
        """Stop the profiler and write this worker's part (and, on the chief, the timeline)."""
        if not self.started or self.finished:
            self.finished = True
            return
        import tensorflow as tf

        self.finished = True
        tf.profiler.experimental.stop()
        events, steps = timeline.events_of(timeline.newest_profile(self.capture_dir))
        folder = os.path.join(self.run_dir, "trace")
        timeline.write_part(_part_path(folder, self.name), self.name, events, steps)
        servers = [(name, timeline.events_of(profile, steps)[0])
                   for name, profile in self.servers.finish()]
        for name, events in servers:
            timeline.write_part(_part_path(folder, name), name, events, steps)
        if self.worker == 0:
            self._merge(folder, len(servers))

    def _seconds_per_step(self, done: int):
        """Seconds a step since the second ``room()``, None before any step was timed."""
        if self.paced is None or done <= self.paced[1]:
            return None
        return (time.monotonic() - self.paced[0]) / (done - self.paced[1])

    def _merge(self, folder: str, servers: int) -> None:
        deadline = time.time() + (MERGE_WAIT if self.workers > 1 else 0)
        while True:
            found = sorted(glob.glob(os.path.join(folder, "*.json")), key=_part_order)
            if len(found) >= self.workers + servers or time.time() >= deadline:
                break
            time.sleep(0.5)
        parts = []
        for path in found:
            with open(path) as f:
                parts.append(json.load(f))
        merged = os.path.join(self.run_dir, "timeline.json")
        with open(merged + ".partial", "w") as f:
            json.dump(timeline.merge(parts), f)
        os.replace(merged + ".partial", merged)
        timeline_png.draw(parts, os.path.join(self.run_dir, "timeline.png"))
        missing = self.workers + servers - len(parts)
        logger.info("trace of steps %d-%d: %s and timeline.png (lanes of %s), the profile "
                    "in %s (tensorboard --logdir %s, profile tab)%s", self.first, self.last,
                    merged, ", ".join(p["worker"] for p in parts), self.capture_dir,
                    self.capture_dir, f"; {missing} worker(s) wrote no part within "
                    f"{MERGE_WAIT} s" if missing > 0 else "")


def _part_path(folder: str, name: str) -> str:
    """``trace/<name>.json``: ``chief.json``, ``worker-1.json``, ``ps-0.json``."""
    return os.path.join(folder, name.replace(" ", "-") + ".json")


def _part_order(path: str):
    """The chief first, then workers, then parameter servers, each by index."""
    job, _, index = os.path.basename(path)[:-len(".json")].partition("-")
    return ({"chief": 0, "worker": 1, "ps": 2}.get(job, 3), int(index or 0))
