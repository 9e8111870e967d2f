"""The servers' lanes of a traced step: the chief captures the profiles of the ``tfdp.server``
processes it drives (the from-scratch path across machines, parameter servers), which run the
step's ops but no loop of their own to mark steps with.

Every TensorFlow gRPC server also serves TensorFlow's profiler service on its own port, so the
chief asks each one, through ``tf.profiler.experimental.client.trace``, to record for a while.
That call records for a fixed duration, chosen before the traced steps run: ``duration_ms``
makes it a few times the steps' expected length (from the pace of the steps before them) plus a
margin, and the chief waits out the rest of it when the steps end sooner. The server writes its
profile itself, under the folder the chief names: on one machine (``tfdp.launch``, emulated
hosts) that is the run folder; on real machines the same path on each server's own disk, to be
copied beside the chief's (docs/section-12.3.md).
"""

import logging
import os
import threading
import time

from tfdp.trace import timeline

logger = logging.getLogger("tfdp")
# Before the first traced step: the servers start recording when the request reaches them.
SETTLE_SECONDS = 0.5
# When no step has run yet to time (tracing from step 1, which also compiles): seconds.
UNKNOWN_PACE_SECONDS = 20.0


def duration_ms(seconds_per_step, steps: int) -> int:
    """How long the servers record ``steps`` traced steps: three times their expected length
    (a traced step runs alone and under the profiler) plus two seconds."""
    if seconds_per_step is None:
        return int(UNKNOWN_PACE_SECONDS * 1000)
    return int((3 * seconds_per_step * steps + 2.0) * 1000)


class ServerCapture:
    """One recording of every server in ``servers`` ([(name, "host:port")]) into
    ``folder/<name>/``, started by ``start`` and collected by ``finish``."""

    def __init__(self, servers: list, folder: str):
        self.servers, self.folder = list(servers), folder
        self.threads, self.error = [], None
        self.ends = 0.0

    def start(self, milliseconds: int) -> None:
        import tensorflow as tf

        self.ends = time.monotonic() + milliseconds / 1000

        def record(name, address):
            try:
                tf.profiler.experimental.client.trace(f"grpc://{address}", self.dir_of(name),
                                                      milliseconds, num_tracing_attempts=1)
            except Exception as e:  # Its lanes are missing; the run goes on.
                self.error = f"{name} at {address}: {type(e).__name__}: {str(e)[:200]}"

        self.threads = [threading.Thread(target=record, args=server, daemon=True,
                                        name=f"profile {server[0]}") for server in self.servers]
        for thread in self.threads:
            thread.start()
        time.sleep(SETTLE_SECONDS)

    def dir_of(self, name: str) -> str:
        return os.path.join(self.folder, name.replace(" ", "-"))

    def finish(self) -> list:
        """Wait for the recordings; [(name, path of its .xplane.pb)] of those that arrived."""
        if not self.threads:
            return []
        left = self.ends - time.monotonic()
        if left > 1:
            logger.info("waiting %.0f s for the servers' profiles to end", left)
        for thread in self.threads:
            thread.join(max(left, 0) + 60)
        if self.error:
            logger.warning("a server's profile is missing: %s", self.error)
        found = []
        for name, _ in self.servers:
            try:
                found.append((name, timeline.newest_profile(self.dir_of(name))))
            except FileNotFoundError:
                logger.warning("no profile of %s in %s: a server on another machine writes it "
                               "on its own disk", name, self.dir_of(name))
        return found
