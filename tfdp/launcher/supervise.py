"""The launcher's watch over its processes: who decides the run's end, who is restarted, and
how signals become a preemption every process saves for.

The signal handlers only note the signal; the supervising loops raise at a point of their
choosing. An exception raised by a handler can land inside Popen.poll() between its taking
Popen's internal wait lock and the try that releases it: the lock stays taken, and the later
wait() for that worker blocks forever (seen in CI with py-spy: the launcher in Popen._wait,
its chief a zombie nobody reaped).
"""

import signal
import subprocess
import time
from typing import NamedTuple

from tfdp.launcher.output import say
from tfdp.util import files
from tfdp.util.errors import LOST_CONTACT_EXIT_CODE, PREEMPTED_EXIT_CODE

# How often one parameter-server worker is started again after dying while its chief runs.
RESTARTS = 3


class Terminated(Exception):
    pass


SIGNALLED = []
# What stops the launcher, its workers saving first: SIGTERM, Ctrl-C, and SIGHUP (its terminal
# closed).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# A worker joins a group with room (SIGUSR1 to the launcher: ``tfdp.launcher.elastic``).
JOIN_SIGNAL = signal.SIGUSR1
JOINING = []


class Join(Exception):
    pass


def on_join(signum, frame):
    JOINING.append(signum)


def on_signal(signum, frame):
    if signum == signal.SIGHUP:  # The terminal has gone: the workers' lines may not reach it.
        files.away_from_a_closed_terminal()
    SIGNALLED.append(signum)


def signalled() -> str:
    """The name of the first signal that stopped the launcher."""
    return {signal.SIGHUP: "SIGHUP"}.get(SIGNALLED[0], "SIGTERM") if SIGNALLED else "SIGTERM"


def exit_status(code: int) -> int:
    """The launcher's exit status for a process's exit ``code``, as a shell reports it: killed
    by signal N (``-N``), 128 + N."""
    return code if code >= 0 else 128 - code


def raise_if_signalled():
    if signal.SIGINT in SIGNALLED:
        raise KeyboardInterrupt()
    if SIGNALLED:
        raise Terminated()


class Left(NamedTuple):
    """Workers that ended while the others ran (``tfdp.launcher.elastic``): their indexes and
    exit codes (None: hung, ``hung``; ``CUT_OFF``: an emulated host's link down)."""
    failed: list


CUT_OFF = "cut off"


class ChiefLost(NamedTuple):
    """The from-scratch client of a group that may start it again was killed (its exit code:
    a signal's, -N): a new client cannot take over its servers' replicas, so the group
    re-forms from its newest backup (``tfdp.launcher.elastic``)."""
    code: int


def supervise(procs, poll_seconds, grace, going_on: int = 0, cut=None):
    """The exit code of a group of workers that ends together, or, where ``going_on`` workers
    may go on without those that failed (an elastic group, and that many left), ``Left``;
    ``cut()``: the workers whose emulated host is cut off, lost whether they ended or not."""
    while True:
        raise_if_signalled()
        if JOINING:
            JOINING.clear()
            raise Join()
        codes = [p.poll() for p in procs]  # Poll every worker, each time round.
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            i, code = failed[0]
            if code == PREEMPTED_EXIT_CODE:  # The others stop at the same step on their own.
                say(f"tfdp.launch: worker {i} was preempted; waiting for the others to save")
                codes = wait(procs, grace)
                return (PREEMPTED_EXIT_CODE if set(codes) == {PREEMPTED_EXIT_CODE}
                        else next(c for c in codes if c != PREEMPTED_EXIT_CODE) or 1)
            # Those that lost contact with the lost ones are survivors: they can re-form.
            lost = [(i, c) for i, c in failed if c != LOST_CONTACT_EXIT_CODE]
            if going_on and not lost and cut:
                lost = [(i, CUT_OFF) for i in cut()]
            if going_on and not lost:
                lost = hung(procs)
            if going_on and lost and len(procs) - len(lost) >= going_on:
                return Left(lost)
            i, code = (lost or failed)[0]
            if not isinstance(code, int):  # Hung or cut off, and too few left without it.
                say(f"tfdp.launch: worker {i} {'hung' if code is None else code}: its peers "
                    "lost contact with it; stopping the others")
                return exit_status(failed[0][1])
            say(f"tfdp.launch: worker {i} exited with {code}; stopping the others")
            return exit_status(code)
        if all(c == 0 for c in codes):
            return 0
        time.sleep(poll_seconds)


# Seconds the workers that lost contact with a peer have to end likewise, before those still
# running are taken to be the hung peers (each one's watchdog gave up at about the same time).
HUNG_SETTLE = 5.0
# Seconds the from-scratch client of a group that goes on has, once a server has ended, to
# save the newest whole step its surviving replicas hold (``tfdp.paths.manual.trainer``) and
# end: its next call fails at once (the server's connections closed).
CLIENT_SAVES_WITHIN = 15.0


# Seconds the survivors of a lost ``multi_worker`` worker have to back up the step each holds
# whole and end (``tfdp.training.survivors``): a collective with a killed peer fails within a
# second or so, and a survivor still in a long evaluation is stopped unsaved after them.
SURVIVORS_SAVE_WITHIN = 10.0


def hung(procs) -> list:
    """Where every worker that ended lost contact with a peer and others still run: those
    others, once ``HUNG_SETTLE`` s have let the rest end likewise, ``(index, None)`` each: hung
    (stopped, or stuck) past their peers' watchdog. [] if every worker has ended."""
    deadline = time.time() + HUNG_SETTLE
    while time.time() < deadline:
        codes = [p.poll() for p in procs]
        if any(c not in (None, LOST_CONTACT_EXIT_CODE) for c in codes):
            return []  # Another kind of end: not a hang.
        if None not in codes:
            break
        time.sleep(0.1)
    return [(i, None) for i, p in enumerate(procs) if p.poll() is None]


def supervise_client(procs, specs, poll_seconds, restart=None, going_on: int = 0,
                     chief_again: bool = False, cut=None):
    """The manual and parameter-server paths: the client (``procs[0]``) decides; a server that
    ends first is said once (the client finds out and says what it means for the run). With
    ``restart`` (``restart(i) -> Popen``), a worker that ends is started again instead, up to
    ``RESTARTS`` times each. Where ``going_on`` servers may go on without those that ended (a
    group that regroups, and that many left): ``Left``, the servers' indexes among the
    workers; and where the client lost contact (its watchdog) while every server runs, one of
    them hung: ``Left`` with those stopped by a signal (``(i, None)``), else ``(None, None)``,
    a server it cannot name; a client still running when a server ends is given
    ``CLIENT_SAVES_WITHIN`` to save what the surviving servers' replicas hold first. The group
    re-forms from fresh servers whichever it was, from the client's newest backup. With
    ``chief_again``, a client killed by a signal (from outside, or the kernel's out-of-memory
    killer; not an exit of its own) is ``ChiefLost``: the group may start it again. ``cut()``:
    the processes (positions in ``procs``) whose emulated host is cut off, the servers among
    them lost."""
    reported, restarts = set(), {}
    while True:
        raise_if_signalled()
        if JOINING:
            JOINING.clear()
            raise Join()
        code = procs[0].poll()
        if going_on and code in (None, LOST_CONTACT_EXIT_CODE):
            # The client's step needs every server. One that stopped on its own (0: the client
            # has finished; 75: a preemption the client saves for) is not lost.
            ended = [(i - 1, c) for i, c in enumerate((p.poll() for p in procs[1:]), 1)
                     if c not in (None, 0, PREEMPTED_EXIT_CODE)]
            down = cut() if cut and (ended or code is not None) else []
            # The client's own host cut off: no server is to blame, and the run ends.
            if ended and 0 not in down and len(procs) - 1 - len(ended) >= going_on:
                if code is None:  # It saves the step its surviving replicas hold, then ends.
                    try:
                        procs[0].wait(CLIENT_SAVES_WITHIN)
                    except subprocess.TimeoutExpired:
                        pass
                # A server cut off ends on its own too: its host says why.
                return Left([(i, CUT_OFF if i + 1 in down else c) for i, c in ended])
            if not ended and code == LOST_CONTACT_EXIT_CODE and 0 not in down:
                hung = ([(i - 1, CUT_OFF) for i in down] or
                        [(i - 1, None) for i, p in enumerate(procs[1:], 1) if _stopped(p)] or
                        [(None, None)])
                if len(procs) - 1 - len(hung) >= going_on:
                    return Left(hung)
        # Before the chief's end: it may be why. A chief that lost contact ended after the
        # server it lost, however soon after (within one look here).
        for i, proc in enumerate(procs[1:], 1):
            if i in reported or proc.poll() is None or code not in (None, LOST_CONTACT_EXIT_CODE):
                continue
            role = specs[i].role
            if (restart and code is None and role.startswith("worker")
                    and restarts.get(i, 0) < RESTARTS):
                restarts[i] = restarts.get(i, 0) + 1
                say(f"tfdp.launch: {role} exited with {proc.returncode} while the chief runs; "
                    f"starting it again ({restarts[i]}/{RESTARTS}): the coordinator retries "
                    "its steps on the other workers meanwhile")
                procs[i] = restart(i)
                continue
            reported.add(i)
            say(f"tfdp.launch: {role} exited with {proc.returncode} while the chief runs")
        if code is not None:
            if chief_again and code < 0:
                return ChiefLost(code)
            if code not in (0, PREEMPTED_EXIT_CODE):
                say(f"tfdp.launch: the chief exited with {code}; stopping the workers")
            return exit_status(code)
        time.sleep(poll_seconds)


def _stopped(proc) -> bool:
    """Whether ``proc`` is stopped by a signal (SIGSTOP, a debugger): its state in
    /proc/<pid>/stat (False where that cannot be read)."""
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def preempt(procs, grace) -> list:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    return wait(procs, grace)


def second_ctrl_c() -> bool:
    """Whether Ctrl-C has come twice: stop waiting for the workers to save."""
    return SIGNALLED.count(signal.SIGINT) >= 2


def wait(procs, grace) -> list:
    """Exit codes, waiting up to ``grace`` seconds in all, or until a second Ctrl-C (None for a
    worker still running)."""
    deadline = time.time() + grace
    while time.time() < deadline and not second_ctrl_c():
        # One poll of each, read once: a process may end between two reads.
        running = [p for p in procs if p.poll() is None]
        if not running:
            break
        try:
            running[0].wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
    return [p.poll() for p in procs]


def stop(procs, roles, grace: float = 5.0):
    """SIGTERM every process still running, SIGKILL those alive ``grace`` seconds later (at once
    with no ``grace``: a SIGTERM would ask them to save a step they cannot finish, and their
    lines would say so)."""
    for i, code in enumerate(preempt(procs, grace) if grace else [p.poll() for p in procs]):
        if code is None:
            if grace:
                say(f"tfdp.launch: {roles[i]} did not stop; killing it")
            procs[i].kill()
            procs[i].wait()
