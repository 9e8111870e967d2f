"""What a timing process on an emulated host does (``tfdp.bench.remote_allreduce``,
``tfdp.bench.collective``): time its calls, and stop between phases while the host bench reads
every host's byte counters (``tfdp.bench.host_allreduce``)."""

import sys
import time

# The timing processes print MARK before and after each phase and wait for a line on stdin,
# so the byte counters of every host are read between phases.
MARK = "tfdp-bench-mark"


def mark(label: str) -> None:
    """In a timing process: say where we are, and wait until the counters have been read."""
    print(f"{MARK} {label}", flush=True)
    sys.stdin.readline()


def timed(call, repeats: int) -> list:
    """Seconds of each of ``repeats`` calls of ``call`` (whose result it waits for)."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples
