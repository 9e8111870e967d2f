"""A worker's start-up deadline, kept by a small process of its own.

Creating a MultiWorkerMirroredStrategy waits, inside TensorFlow and holding Python's global
interpreter lock, until every worker of ``TF_CONFIG`` has registered: a peer that never starts
means waiting forever, and no thread of the waiting process (a ``threading.Timer``) nor a
Python signal handler can run meanwhile. So a separate process keeps the deadline: ``start``
spawns ``python -m tfdp.cluster.watchdog``; if the worker does not ``cancel`` it within ``seconds``,
it prints one line naming the peers that never answered and ends the worker. It exits on its
own when the worker dies (its stdin, a pipe from the worker, closes).

Ending the worker: SIGKILL would make its exit status 137, which supervisors (Kubernetes among
them) read as "killed, probably out of memory". A Python handler cannot run while TensorFlow
holds the interpreter lock, but a C one can: while the deadline runs, the worker's SIGHUP
handler is libc's ``_exit`` itself, which a signal calls with the signal's number, so SIGHUP
ends the worker with exit status 1 (SIGHUP is 1), the status of every one-line error.
"""

import ctypes
import json
import os
import select
import signal
import subprocess
import sys


# The signal that ends the worker; its number is the worker's exit status.
END_SIGNAL = signal.SIGHUP
_LIBC = ctypes.CDLL(None)  # This process's C library: its signal() and _exit().
_LIBC.signal.restype = ctypes.c_void_p
_LIBC.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]


class Watchdog:
    def __init__(self, proc, previous_handler):
        self._proc, self._previous = proc, previous_handler

    def cancel(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()  # EOF: the watchdog exits quietly.
            self._proc.wait()
        if self._previous is not None:
            _set_c_handler(END_SIGNAL, self._previous)
            self._previous = None


def start(seconds: float, peers: list, flag: str = "--collective_timeout") -> Watchdog:
    """End this process (exit status 1) after ``seconds`` unless cancelled; ``peers``:
    [(name, "host:port")]."""
    previous = _set_c_handler(END_SIGNAL, ctypes.cast(_LIBC._exit, ctypes.c_void_p).value)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfdp.cluster.watchdog", str(os.getpid()), str(seconds), flag,
         json.dumps(peers)], stdin=subprocess.PIPE, close_fds=True)
    return Watchdog(proc, previous)


def _set_c_handler(signum: int, handler: int) -> int:
    """Make the C function at address ``handler`` ``signum``'s handler; return the previous."""
    return _LIBC.signal(signum, handler) or 0


def main(argv) -> int:
    parent, seconds, flag, peers = int(argv[1]), float(argv[2]), argv[3], json.loads(argv[4])
    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    if ready:  # Cancelled, or the worker has gone: either way, nothing to do.
        return 0
    from tfdp.cluster.tf_config import did_not_start

    sys.stderr.write(f"tfdp.train: error: {did_not_start(seconds, peers, flag=flag)}\n")
    sys.stderr.flush()
    try:
        os.kill(parent, END_SIGNAL)  # It waits inside TensorFlow: only a C handler can run.
    except ProcessLookupError:
        pass
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
