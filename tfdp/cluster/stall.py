"""Stall detection: a deadline on every call into a cluster, and what a lost peer raises.

TensorFlow sets no deadline on a remote call: a worker or server cut off (its process alive, its
link down) leaves the caller waiting for ever. ``Stall`` keeps the deadline in a thread of its
own (the calls wait inside TensorFlow with Python's lock released, and nothing else can
interrupt them) and ends the process, in one line naming the peers that do not answer now,
when one call outlasts ``--collective_timeout``. A peer that has died makes the call raise one
of ``PEER_LOST`` instead, which the run skeleton turns into the same kind of line.

Where the path can ask its peers (``probe``), one thread per peer also asks it a trivial
question every ``PROBE_EVERY`` s while a call is watched, and keeps each silence longer than the
path's threshold: a process stopped for a while and resumed is named whatever it was doing when
it stopped (computing, exchanging gradients, or idle between steps), which the replicas' own
times alone cannot tell (``tfdp.trace.arrivals``).
"""

import contextlib
import os
import sys
import threading
import time

import tensorflow as tf

from tfdp.cluster import tf_config
from tfdp.util.errors import LOST_CONTACT_EXIT_CODE

STARTING = "waiting for the workers to start"
PROBE_EVERY = 0.25
# What a step, a collective or a read raises when a peer has died or cannot be reached
# (heartbeats stopped, a collective timed out, or the coordination service aborted it).
PEER_LOST = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
             tf.errors.AbortedError, tf.errors.CancelledError)


class Stall:
    """Ends this process when one call watched with ``watching`` outlasts ``seconds``: one line
    naming the ``peers`` ([(name, "host:port")]) that do not answer now, then exit 1."""

    def __init__(self, seconds: float, peers: list, kept_steps=lambda: []):
        self.seconds, self.peers, self.kept_steps = seconds, peers, kept_steps
        self.recorder = None  # The path's tfdp.trace.flight_recorder.FlightRecorder.
        # The path's ``unresponsive() -> [(name, address)]``: peers whose port is open but whose
        # process runs nothing (stopped, hung), where the path can ask (an op on each worker).
        self.unresponsive = None
        self._since = None
        self._doing = ""
        self._watched = threading.Event()
        self._silences, self._lock = [], threading.Lock()
        threading.Thread(target=self._keep, daemon=True, name="tfdp-stall").start()

    @contextlib.contextmanager
    def watching(self, doing: str):
        self._since, self._doing = time.monotonic(), doing
        self._watched.set()
        try:
            yield
        finally:
            self._watched.clear()
            self._since = None

    def probe(self, ask, longer_than: float) -> None:
        """Ask each peer ``ask(p)`` (``p`` its index in ``peers``; a trivial op there) every
        ``PROBE_EVERY`` s while a call is watched; keep each answer that took ``longer_than`` s
        or more as a silence (``silences``)."""
        for p, (name, _) in enumerate(self.peers):
            threading.Thread(target=self._ask, args=(ask, p, name, longer_than), daemon=True,
                             name=f"tfdp-probe-{p}").start()

    def _ask(self, ask, p: int, name: str, longer_than: float):
        while True:
            self._watched.wait()
            doing, asked = self._doing, time.time()
            try:
                ask(p)
            except tf.errors.OpError:
                return  # A peer lost: the watched call's error, or the deadline, says so.
            answered = time.time()
            if answered - asked >= longer_than:
                with self._lock:
                    self._silences.append((name, asked, answered, doing))
            time.sleep(PROBE_EVERY)

    def silences(self) -> list:
        """The silences kept since the last call, oldest first: ``(peer's name, Unix time
        asked, Unix time answered, what the watched call was doing when asked)``."""
        with self._lock:
            kept, self._silences = self._silences, []
        return kept

    def _keep(self):
        while True:
            time.sleep(min(1.0, self.seconds / 4))
            since = self._since
            if since is not None and time.monotonic() - since > self.seconds:
                if self._doing == STARTING:  # Never had a cluster: an error like any other.
                    code, line = 1, tf_config.did_not_start(
                        self.seconds, self.peers, start="a tfdp.server for every worker",
                        suggest_longer=False)
                else:
                    code = LOST_CONTACT_EXIT_CODE
                    why = (f"no answer for {self.seconds:g} s while {self._doing}, "
                           "--collective_timeout")
                    hung = self.unresponsive() if self.unresponsive is not None else []
                    line = tf_config.lost_contact(why, self.peers, "", self.kept_steps(), hung)
                    if hung:  # The record says which steps were in flight, and who held them.
                        why += "; not answering: " + ", ".join(name for name, _ in hung)
                    line += self.recorder.recorded(why) if self.recorder is not None else ""
                sys.stderr.write(f"tfdp.train: error: {line}\n")
                sys.stderr.flush()
                os._exit(code)  # The main thread waits inside TensorFlow: nothing else can.


def watching(stall, doing: str):
    """``stall.watching(doing)``, or nothing where there is no cluster to watch (``stall`` is
    None)."""
    return stall.watching(doing) if stall is not None else contextlib.nullcontext()


def read_after_a_loss(read, seconds: float = 2.0, pause: float = 0.2):
    """``read()`` (of a surviving worker's variables, or a trivial op on it), asked again every
    ``pause`` seconds until it succeeds or ``seconds`` have passed. After a peer is lost, the
    first ops sent to a worker that was exchanging tensors with it can fail with the lost peer's
    error ("remote address ... poisoned", "failed to connect" to the lost one's address), and
    the same op asked again succeeds (seen with TF 2.21 on the from-scratch path: the survivor
    answered on the second or third try, and under load later than a fixed 3 tries allowed). A
    worker that is gone fails every time: its last error is raised."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return read()
        except tf.errors.OpError:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)


def clear_a_lost_peers_errors(seconds: float = 2.0) -> None:
    """After a peer is lost: clear the error this process's eager executors and the surviving
    workers' keep of it (``Context.clear_executor_errors``). Kept, every later op sent to a
    worker that was receiving the lost one's tensors fails with it, however often asked (seen
    with TF 2.21 on the from-scratch path, ``add_n``: worker 0, once worker 1 was lost; cleared,
    its replica was read). In a thread, waited for ``seconds`` at most: the clearing waits for
    the operations still pending, which a hung worker may never finish."""
    from tensorflow.python.eager import context

    clearing = threading.Thread(target=_clear_quietly, args=(context.context(),), daemon=True,
                                name="clearing a lost peer's errors")
    clearing.start()
    clearing.join(seconds)


def _clear_quietly(eager_context) -> None:
    with contextlib.suppress(tf.errors.OpError, ValueError):  # ValueError: no context yet.
        eager_context.clear_executor_errors()
