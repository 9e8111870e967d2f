"""A worker's start-up deadline, kept by a small process of its own.

Creating a MultiWorkerMirroredStrategy waits, inside TensorFlow and holding Python's global
interpreter lock, until every worker of ``TF_CONFIG`` has registered: a peer that never starts
means waiting forever, and no thread of the waiting process (a ``threading.Timer``) nor a
Python signal handler can run meanwhile. So a separate process keeps the deadline: ``start``
spawns ``python -m tfdp.cluster.watchdog``; if the worker does not ``cancel`` it within ``seconds``,
it prints one line naming the peers that never answered and kills the worker. It exits on its
own when the worker dies (its stdin, a pipe from the worker, closes).
"""

import json
import os
import select
import signal
import subprocess
import sys


class Watchdog:
    def __init__(self, proc):
        self._proc = proc

    def cancel(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()  # EOF: the watchdog exits quietly.
            self._proc.wait()


def start(seconds: float, peers: list, flag: str = "--collective_timeout") -> Watchdog:
    """Kill this process after ``seconds`` unless cancelled; ``peers``: [(name, "host:port")]."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfdp.cluster.watchdog", str(os.getpid()), str(seconds), flag,
         json.dumps(peers)], stdin=subprocess.PIPE, close_fds=True)
    return Watchdog(proc)


def main(argv) -> int:
    parent, seconds, flag, peers = int(argv[1]), float(argv[2]), argv[3], json.loads(argv[4])
    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    if ready:  # Cancelled, or the worker has gone: either way, nothing to do.
        return 0
    from tfdp.cluster.tf_config import did_not_start

    sys.stderr.write(f"tfdp.train: error: {did_not_start(seconds, peers, flag=flag)}\n")
    sys.stderr.flush()
    try:
        os.kill(parent, signal.SIGKILL)  # It waits inside TensorFlow: nothing else stops it.
    except ProcessLookupError:
        pass
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
