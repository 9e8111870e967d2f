"""Signals acted on while the main thread is inside TensorFlow (a step, a collective): a second
Ctrl-C ends the process at once, and a cluster's run that cannot reach a step to save at within
``tfdp.training.preemption.STOP_WITHIN`` s of a stop signal ends naming its newest backup.
Python runs its signal handlers in the main thread only, between bytecodes; a thread that reads
the signals' wakeup file descriptor sees each at once.
"""

import contextlib
import os
import select
import signal
import sys
import threading
import time

from tfdp.training import preemption
from tfdp.util.errors import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, Interrupted


@contextlib.contextmanager
def mid_step_signals(program: str):
    """While entered (from the main thread), a second SIGINT ends the process at once with one
    line and ``INTERRUPTED_EXIT_CODE``, and a run with peers still training ``STOP_WITHIN`` s
    after a stop signal ends with one line naming its newest backup
    (``preemption.stuck_run``) and ``PREEMPTED_EXIT_CODE``. Python runs a signal handler only
    between bytecodes, so not while TensorFlow computes a step or waits in a collective; but
    the C-level handler writes every signal's number to the wakeup file descriptor at once,
    and a thread that reads it can act mid-step."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    thread = threading.Thread(target=_watch_signals, args=(read_end, program), daemon=True)
    thread.start()
    preemption.SECOND_CTRL_C_EXITS.set()
    try:
        yield
    finally:
        preemption.SECOND_CTRL_C_EXITS.clear()
        signal.set_wakeup_fd(previous)
        os.close(write_end)  # The thread reads the end of the pipe and returns.
        thread.join()
        os.close(read_end)


def _watch_signals(read_end: int, program: str) -> None:
    # Only the main thread takes SIGTERM (``tfdp.util.main_thread``): this one reads it.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    seen, deadline, by = 0, None, None
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([read_end], [], [], wait)[0]:  # The deadline has come.
            deadline = None
            line = preemption.stuck_run()
            if line:
                _exit_now(program, f"preempted ({by}) while training: {line}",
                          PREEMPTED_EXIT_CODE)
            continue
        received = os.read(read_end, 64)
        if not received:
            return
        seen += received.count(signal.SIGINT)
        # Exported, or stopped with its state kept: nothing left to cut short.
        if (seen >= 2 and not preemption.exported() and not preemption.stopped()
                and preemption.interrupting()):
            _exit_now(program, str(Interrupted()), INTERRUPTED_EXIT_CODE)
        stops = [name for name in map(preemption.stop_signal, received) if name]
        if stops and deadline is None:
            deadline, by = time.monotonic() + preemption.STOP_WITHIN, stops[0]


def _exit_now(program: str, line: str, code: int) -> None:
    os.write(sys.stderr.fileno(), f"\n{program}: {line}\n".encode())
    os._exit(code)
