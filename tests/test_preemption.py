"""Preemption inside one process: a signal while modules import, during a step or inside
TensorFlow's callbacks, a second Ctrl-C, a SIGTERM after the stop, the threads TensorFlow
starts.
Ctrl-C typed in a real terminal, and a terminal closed: tests/test_terminal_signals.py; a launched
cluster preempted: tests/test_launcher_preemption.py."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import SHELL_SIGNALS
from processes import child_env
from tfdp.training import preemption
from tfdp.training.backups import Backups
from tfdp.util.errors import PREEMPTED_EXIT_CODE, Preempted


# --- Preemption ---------------------------------------------------------------------------------

def _import_machinery(error):
    """The error a Ctrl-C during a real terminal's start-up came out as: the import lock's,
    then the half-initialized module's (seen under load in this suite)."""
    try:
        raise SystemError("<built-in function acquire_lock> returned a result with an exception "
                          "set") from error
    except SystemError:
        raise AttributeError("'tuple' object has no attribute '_type_spec'")


@pytest.mark.parametrize("passed_on", [
    lambda e: ImportError("initialization failed"),  # pybind11's, in a CI run.
    _import_machinery], ids=["native module", "import lock"])
def test_a_signal_while_modules_import_is_still_the_preemption(passed_on):
    """A real SIGINT whose handler's ``Preempted`` reaches the caller as an import passes it
    on, the preemption in its chain: the command's own line, not a traceback."""
    with pytest.raises(Preempted, match="preempted \\(Ctrl-C\\) at step 0"):
        with preemption.preempt_outside_runs():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # The handler raises here, at the next bytecode.
            except Preempted as e:
                raise passed_on(e) from e


def test_a_signal_never_raises_inside_a_run_it_waits_for_a_step_or_a_stage_end():
    """The handler only sets the flag, wherever Python is (TensorFlow's own code called back
    from C++, often): the loop stops between steps, the run at its next stage's end
    (``check``), and a stop at the step training started from has nothing new to save."""
    before = signal.getsignal(signal.SIGTERM)  # Another test's command may have left its own.
    with preemption.Watch() as watch:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # Python runs the handler at the next bytecode: it must not raise.
        assert watch.requested
        watch.reached(7)
        with pytest.raises(Preempted, match="at step 7: nothing new to save"):
            watch.check()
    with preemption.Watch() as watch:
        with watch.training(first_step=7):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            assert watch.requested
            with pytest.raises(Preempted, match="at step 7: nothing new to save"):
                watch.stop(7, Backups("/nonexistent", 0, {}), lambda: None)
        watch.finished()
        os.kill(os.getpid(), signal.SIGTERM)  # A finished run ignores it.
        time.sleep(0.01)
        watch.check()
    assert signal.getsignal(signal.SIGTERM) == before  # Restored afterwards.


def test_a_sigterm_after_a_stop_cannot_change_the_exit_status():
    """A command-line run stopped for a SIGTERM, its state saved: a SIGTERM more (Slurm repeats
    it as it ends the step) neither raises a second Preempted nor, once the run is left, kills
    the process during TensorFlow's teardown: the status stays the one that asks for a requeue.
    (A real CI run under load lost its requeue so: one worker killed after its save.)"""
    with pytest.raises(Preempted) as stopped:
        with preemption.preempt_outside_runs():
            with preemption.Watch() as watch:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
                saved = watch.preempted(5, "/runs/backup/step-5.npz")
            os.kill(os.getpid(), signal.SIGTERM)  # On the way out: ignored.
            time.sleep(0.01)
            raise saved
    assert stopped.value is saved
    # Until the process exits (here, until conftest.signals_as_a_shell_gives_them).
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


@pytest.fixture(scope="module")
def a_command_run_here_by_a_module_fixture():
    """What a reference run trained in this process by a module's fixture leaves: its command
    line's signals ignored (``preempt_outside_runs``, after the export)."""
    for signum in SHELL_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def test_a_test_after_a_command_ran_in_this_process_starts_with_the_shells_signals(
        a_command_run_here_by_a_module_fixture):
    """The processes a test starts inherit its signals' dispositions: after a command run here
    (even in a fixture before the test's own), a launcher started with SIGINT ignored would keep
    it so, and a Ctrl-C typed in its terminal would do nothing (seen in a whole run)."""
    assert {s: signal.getsignal(s) for s in SHELL_SIGNALS} == SHELL_SIGNALS
    child = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal("
                            "signal.SIGINT) == signal.SIG_IGN)"], capture_output=True, text=True)
    assert child.stdout.strip() == str(SHELL_SIGNALS[signal.SIGINT] == signal.SIG_IGN)


def test_a_second_ctrl_c_after_the_state_is_saved_has_nothing_to_cut_short():
    """The command line's watch (``preempt_outside_runs``, ``mid_step_signals``): a first
    Ctrl-C, the run's state saved, then a second on the way out (a whole run met it: the step
    under way ended within the 0.2 s between two Ctrl-Cs) is ignored: not the 130 of "the steps
    since the newest backup are lost", nor a second ``Preempted``."""
    script = """if True:
        import os, signal, sys, time
        from tfdp.training import mid_step, preemption
        from tfdp.util.errors import Preempted
        try:
            with preemption.preempt_outside_runs(), mid_step.mid_step_signals("tfdp.train"):
                with preemption.Watch() as watch:
                    watch.install()
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.2)
                    saved = watch.preempted(5, "/runs/backup/step-5.npz")
                os.kill(os.getpid(), signal.SIGINT)  # On the way out.
                time.sleep(0.5)  # Where the second Ctrl-C's thread would end the process.
                raise saved
        except Preempted as e:
            print(e, flush=True)
            sys.exit(75)
    """
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert done.returncode == PREEMPTED_EXIT_CODE, (done.stdout, done.stderr)
    assert done.stdout.startswith("preempted (Ctrl-C) at step 5: state of step 5 saved in "
                                  "/runs/backup/step-5.npz"), done.stdout
    assert "stopped at once" not in done.stderr, done.stderr


def test_a_second_ctrl_c_is_acted_on_once_naming_the_run_folder():
    """A second Ctrl-C reaches both the run's handler (in the main thread, between bytecodes)
    and the command line's mid-step watch (a thread reading the signals' wakeup descriptor).
    Where the watch is, it alone acts: the handler runs wherever Python is, and its
    ``Interrupted`` raised inside TensorFlow's tracing came out of the run as a SystemError with
    a traceback (a whole run's Ctrl-C test, 2026-12-07). Without the watch (a notebook's
    ``tfdp.run``) the handler raises it. Either way one line names the run folder a default
    chose."""
    script = """if True:
        import os, signal, sys, time
        from tfdp.training import mid_step, preemption
        from tfdp.util import errors
        try:  # As in a notebook: no watch, the handler raises.
            with errors.naming_the_run("runs/a"), preemption.Watch() as w:
                w._on_signal(signal.SIGINT, None)
                w._on_signal(signal.SIGINT, None)
        except errors.Interrupted as e:
            print("raised:", e, flush=True)
        with preemption.preempt_outside_runs(), mid_step.mid_step_signals("tfdp.train"):
            wakeup = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(wakeup)
            with errors.naming_the_run("runs/manual-lenet-2dev"), preemption.Watch() as w:
                w._on_signal(signal.SIGINT, None)
                w._on_signal(signal.SIGINT, None)  # The handler: not raised.
                print("the handler did not raise", flush=True)
                os.write(wakeup, bytes([signal.SIGINT, signal.SIGINT]))  # The watch ends it.
                time.sleep(30)
    """
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert done.returncode == 130, (done.stdout, done.stderr)
    assert done.stdout.startswith("raised: stopped at once (a second Ctrl-C)") and \
        "again with --workdir=runs/a to resume" in done.stdout, done.stdout
    assert "the handler did not raise" in done.stdout, done.stdout
    assert done.stderr.strip().endswith(
        "run the same command again with --workdir=runs/manual-lenet-2dev to resume from it"), \
        done.stderr
    assert done.stderr.count("stopped at once") == 1, done.stderr


def test_the_launcher_waits_for_workers_that_end_while_it_looks():
    """A process that ends between two of the launcher's polls (seen under a loaded machine:
    ``ValueError: None is not in list`` from a rerun that had finished) is one that ended."""
    from tfdp.launcher import supervise

    class EndsWhenPolled:
        def __init__(self, running_polls):
            self.running_polls = running_polls

        def poll(self):
            self.running_polls -= 1
            return None if self.running_polls >= 0 else 0

        def wait(self, timeout):
            return self.poll()

    assert supervise.wait([EndsWhenPolled(0), EndsWhenPolled(1)], grace=5) == [0, 0]


def test_a_signal_inside_tensorflows_callbacks_is_held_for_the_next_stage_end():
    """A signal whose handler runs in Python code that TensorFlow's C++ called (here a
    ``py_function``; in a run, a step being made, which once gave an ``AttributeError`` from
    ``nest.flatten`` and once a segmentation fault): a ``Preempted`` raised there comes out of
    TensorFlow as an ``UnknownError`` with its tracebacks printed, so the handler never raises;
    the run's next check does."""
    import tensorflow as tf

    def inside_tensorflow(x):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # The handler runs here, called from TensorFlow's kernel.
        return x

    with preemption.Watch() as watch:
        assert tf.py_function(inside_tensorflow, [tf.constant(1.0)], tf.float32).numpy() == 1.0
        with pytest.raises(Preempted, match="preempted \\(SIGTERM\\) at step 0: nothing new"):
            watch.check()


OPEN_TO_SIGTERM = """
import glob, os, threading
from tfdp.util import logs
logs.import_tensorflow()
for status in glob.glob("/proc/self/task/*/status"):
    fields = dict(line.split(":", 1) for line in open(status) if ":" in line)
    if int(fields["Pid"]) != threading.main_thread().native_id:
        print(fields["Name"].strip(), bool(int(fields["SigBlk"], 16) & 1 << signal_bit))
""".replace("signal_bit", str(signal.SIGTERM - 1))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_the_threads_tensorflow_starts_never_take_sigterm():
    """TensorFlow's own threads start with SIGTERM blocked (``tfdp.util.main_thread``)."""
    done = subprocess.run([sys.executable, "-c", OPEN_TO_SIGTERM], capture_output=True,
                          text=True, env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    threads = [line.rsplit(" ", 1) for line in done.stdout.splitlines()]
    assert threads and all(blocked == "True" for _, blocked in threads), done.stdout
