"""SIGTERM, SIGHUP (a closed terminal) or a first Ctrl-C is a preemption: stop at a step
boundary, save, exit non-zero, resume later.

``Watch`` turns SIGTERM and SIGINT into a flag, and never raises from the signal handler while
a run is in progress: a handler runs wherever Python is, often TensorFlow's Python called back
from its C++ (tracing a step, writing a SavedModel), where an exception raised came out as
another error (``nest.flatten``'s ``AttributeError``) or a segmentation fault.
The training loop reads the flag between steps (a step is never cut in half, and the state
saved is a step's); the run's set-up reads it between its stages and the run before its export
(``check``: nothing new to save). A signal during the export lets it finish: the run is then
complete, and exits 0. A second Ctrl-C while the first is being honoured means "do not wait": on
the command line (``tfdp.training.mid_step``) the process exits at once with one line, even in
the middle of a step; in a notebook, where exiting would kill the kernel, it raises ``Interrupted``
(a ``KeyboardInterrupt``) as soon as Python runs again. Either way the newest backup is kept.
Interrupting a notebook's kernel is a Ctrl-C: ``tfdp.run`` saves and raises ``Preempted``.

Under MultiWorkerMirroredStrategy every worker must stop after the same step: the workers
exchange their flags with one small all-reduce every ``check_every`` steps (``agree`` in
``tfdp.paths.keras.callback``), so a SIGTERM to any one worker stops all of them at the same step.
TensorFlow's ``PreemptionCheckpointHandler`` was not used: it probes GCP's metadata server when
created, and on GCP CPU machines does nothing (``failure_handling.py``, ``detect_platform``).

A stop must also be prompt where no step can finish: a cluster's process whose collective waits
for a lost peer would wait ``--collective_timeout`` (300 s), past any cluster manager's grace
period. On the command line a thread reads the signals as they come (``tfdp.training.mid_step``)
and, ``STOP_WITHIN`` s after a stop signal, ends a run with peers that is still training and
not saving, in one line naming its newest backup (``Watch.stuck``), exit 75.

Creating a MultiWorkerMirroredStrategy installs TensorFlow's C++ SIGTERM handler (its
preemption notifier), which ignores the signal; ``Watch`` replaces it, and before the Watch,
``tfdp.paths.keras.strategy.sigterm_kept``. Meanwhile only the main thread may take SIGTERM
(``hold_until_main``, ``tfdp.util.main_thread``).
"""

import contextlib
import signal
import threading
import time

from tfdp.launcher import regrouping
from tfdp.util import errors, files
from tfdp.util.errors import Interrupted, Preempted

# SIGHUP (the terminal closed, the ssh session lost) is a preemption too, as torchrun takes
# it; unless it is ignored (``nohup``), which tfdp leaves as it is.
HANGUP = signal.SIGHUP
SIGNALS = (signal.SIGTERM, signal.SIGINT, HANGUP)
NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C", HANGUP: "SIGHUP"}


def _taken(signum) -> bool:
    """Whether tfdp takes ``signum``: not SIGHUP where this process ignores it (``nohup``)."""
    return not (signum == HANGUP and signal.getsignal(HANGUP) == signal.SIG_IGN)


class Watch:
    """While entered, SIGTERM or SIGINT sets ``requested``: the training loop stops between
    steps (``stop``), the run elsewhere at its next ``check``; a second SIGINT raises
    ``Interrupted`` (where no mid-step watch ends the process instead). The loop says which
    step it has reached (``reached``), so a signal outside training names it."""

    def __init__(self):
        self._requested = False
        self.signal = None  # What asked: "SIGTERM" or "Ctrl-C", for the messages.
        self.step = 0  # The last step reached, for the message when a signal comes outside.
        self._training = False
        self._first = None  # The step training started from: a stop there has nothing new.
        self.workers = 1  # Training processes of one model: several stop where they agree.
        self._finished, self._previous = False, {}
        self._elsewhere, self._every, self._asked = None, 0.0, 0.0
        # A run with peers that may be lost has STOP_WITHIN s to save after a stop signal.
        self.peers, self.backups, self._saving = False, None, False

    @property
    def requested(self) -> bool:
        """Whether to stop after the step under way: a signal here, or one that ``listen``'s
        poll found elsewhere."""
        if not self._requested and self._elsewhere and self._training:
            now = time.monotonic()
            if now - self._asked >= self._every:
                self._asked = now
                by = self._elsewhere()
                if by:
                    self._requested, self.signal = True, self.signal or by
        return self._requested

    def listen(self, poll, every: float = 1.0) -> None:
        """During training, also stop when ``poll()`` names a signal sent elsewhere (a worker
        of the from-scratch path: ``tfdp.paths.manual.remote``); asked at most every ``every``
        seconds, where the loop looks for a signal."""
        self._elsewhere, self._every = poll, every

    def __enter__(self):
        if _INTERRUPTING.locked():  # A new run: no second Ctrl-C is being acted on.
            _INTERRUPTING.release()
        self.install()
        return self

    def install(self) -> None:
        """Take SIGTERM and SIGINT (again: see the module's last paragraph)."""
        if threading.current_thread() is threading.main_thread():  # Only it may set handlers.
            for signum in filter(_taken, SIGNALS):
                previous = signal.signal(signum, self._on_signal)
                self._previous.setdefault(signum, previous)

    def __exit__(self, *exc):
        # Python's idea of the previous handlers: SIG_DFL where TF's C++ one was installed, so
        # after a run SIGTERM terminates the process again, and Ctrl-C raises KeyboardInterrupt.
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        return False

    @contextlib.contextmanager
    def training(self, first_step: int):
        """Training from ``first_step``: a SIGTERM now waits for the end of a step."""
        self.step, self._first, self._training = first_step, first_step, True
        if self.peers:
            _WITH_PEERS[:] = [self]
        try:
            yield self
        finally:
            self._training = False
            _WITH_PEERS.clear()

    def reached(self, step: int) -> None:
        self.step = step

    def finished(self) -> None:
        """The run has exported: nothing is left to lose, and a signal from now on is ignored
        (stopping now would only make a supervisor rerun a finished run; on the command line,
        until the process exits: ``preempt_outside_runs``)."""
        self._finished = True
        _FINISHED.set()

    def _on_signal(self, signum, frame):
        if signum == HANGUP:
            files.away_from_a_closed_terminal()
        if self._finished:
            return
        # Raised only where no thread ends the process instead: in a handler that Python runs
        # inside TensorFlow's C++ (tracing), the exception came out as a SystemError.
        if (self._requested and signum == signal.SIGINT and not SECOND_CTRL_C_EXITS.is_set()
                and interrupting()):
            raise Interrupted()
        self._requested, self.signal = True, self.signal or NAMES[signum]

    def check(self) -> None:
        """Between two stages of a run (no TensorFlow code under way): raise ``Preempted`` if a
        signal has come (nothing new to save). Not with several ``workers``: one stopping alone
        would leave the others waiting in a collective, so the flag waits for the checks they
        agree on (the Keras callback's), and after training the run completes."""
        if self._requested and not self._finished and self.workers == 1:
            raise self.preempted(self.step)

    def preempted(self, step: int, saved: str = None) -> Preempted:
        """The ``Preempted`` of ``step``, saved in ``saved``, naming the signal that asked."""
        _STOPPED.set()
        run_dir = self.backups.run_dir if self.backups is not None else None
        return Preempted(step, saved, by=self.signal, then=regrouping.then(run_dir))

    def stop(self, step: int, backups, state):
        """Raise ``Preempted`` after saving ``step`` (``state()``: the run's
        ``tfdp.training.state.TrainingState``, all an epoch's end saves; nothing is saved
        without ``backups``, or at the step training started from: its backup exists)."""
        new = backups is not None and step != self._first
        self._saving = True  # Every peer reached this step: the save ends on its own.
        raise self.preempted(step, backups.save(step, state()) if new else None)

    def stuck(self) -> str:
        """If this run still trains, not saving: the line that ends it naming its newest backup."""
        if not self._training or self._saving or _FINISHED.is_set():
            return ""
        kept = self.backups.steps() if self.backups is not None else []
        where = (f"the newest backup, of step {kept[-1]}, is in {self.backups.folder}" if kept
                 else "no backup was written yet")
        return (f"no step of the cluster finished within {STOP_WITHIN:g} s (a peer lost?), so "
                f"nothing new is saved; {where}; {errors.rerun()} to resume")


# Seconds a run with peers has, after a stop signal, to reach a step boundary and save: past
# it (a collective waiting for a peer that is gone waits --collective_timeout), the process
# ends naming its newest backup, well inside Kubernetes' and Slurm's 30 s grace periods.
STOP_WITHIN = 15.0
_WITH_PEERS = []  # The Watch of this process's run while it trains with peers.


def stuck_run() -> str:
    """The line that ends this process's run with peers if it is stuck (``Watch.stuck``)."""
    return _WITH_PEERS[0].stuck() if _WITH_PEERS else ""


def exported() -> bool:
    """Whether a run of this process has exported (then nothing is left to stop)."""
    return _FINISHED.is_set()


def stopped() -> bool:
    """Whether a run of this process has stopped for a signal and kept its state: on its way
    out, with its one line and exit 75."""
    return _STOPPED.is_set()


_INTERRUPTING = threading.Lock()  # Held by whichever acts on a second Ctrl-C first.
# Set while a command line's thread ends the process on a second Ctrl-C (tfdp.training.mid_step).
SECOND_CTRL_C_EXITS = threading.Event()


def interrupting() -> bool:
    """Whether the caller is the first to act on a second Ctrl-C of this run: the one that acts
    (the mid-step watch on the command line, ``SECOND_CTRL_C_EXITS``; else the run's handler)
    acts once, and a third Ctrl-C while the first is under way does nothing more."""
    return _INTERRUPTING.acquire(blocking=False)


def stop_signal(signum: int):
    """The name of stop signal ``signum`` as tfdp takes it, or None (not one, or ignored)."""
    return NAMES[signum] if signum in NAMES and _taken(signum) else None


_HELD = []  # Signals that came while a command line imported its modules (``hold_until_main``).
_BLOCKED = []  # SIGTERM, blocked meanwhile.


def hold_until_main() -> None:
    """A command line's first call: a SIGTERM or Ctrl-C while its modules import is held (raised
    there, it came out of the import machinery as a traceback), SIGTERM blocked, until
    ``preempt_outside_runs`` ends the command in its one line."""
    for signum in filter(_taken, SIGNALS):
        signal.signal(signum, lambda signum, frame: _HELD.append(signum))
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        _BLOCKED.append(signal.SIGTERM)


_FINISHED = threading.Event()  # A run of this process has exported (``Watch.finished``).
_STOPPED = threading.Event()  # ... has stopped for a signal, its state saved (``preempted``).


@contextlib.contextmanager
def preempt_outside_runs():
    """For a command line's whole life: a SIGTERM or Ctrl-C before a run's ``Watch`` takes them
    over raises ``Preempted`` (nothing to save), not a silent end or ``KeyboardInterrupt``
    (raised inside a C extension's code, as TensorFlow's import is, CPython then kills itself
    with SIGINT at exit: status -2 after tfdp's line). Once a run has exported, or stopped for
    a signal and kept its state (``stopped``), they are ignored until the process exits: in
    TensorFlow's seconds of teardown a repeat (Slurm repeats SIGTERM as it ends a step) turned
    a finished run into one to run again, and a requeue's exit 75 into a death by SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def outside_runs(signum, frame):
        if signum == HANGUP:
            files.away_from_a_closed_terminal()
        if not _FINISHED.is_set() and not _STOPPED.is_set():
            raise Preempted(0, by=NAMES[signum])

    _FINISHED.clear()
    _STOPPED.clear()
    previous = {signum: signal.signal(signum, outside_runs) for signum in filter(_taken, SIGNALS)}
    try:
        if _BLOCKED:  # One held since start-up comes now, to outside_runs.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [_BLOCKED.pop()])
        if _HELD:
            if HANGUP in _HELD:
                files.away_from_a_closed_terminal()
            raise Preempted(0, by=NAMES[_HELD[0]])
        yield
    except Exception as e:
        # A signal while modules import (TensorFlow's) comes out as what the import made of it:
        # pybind11's "ImportError: initialization failed", the import lock's SystemError, a
        # half-initialized module's AttributeError (a terminal's Ctrl-C at start-up).
        preempted = _preemption_behind(e)
        if preempted:
            raise preempted from None
        raise
    finally:
        for signum, handler in previous.items():
            settled = _FINISHED.is_set() or _STOPPED.is_set()
            signal.signal(signum, signal.SIG_IGN if settled else handler)


def _preemption_behind(error: BaseException):
    """The ``Preempted`` in ``error``'s chain of causes and contexts, or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Preempted):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
