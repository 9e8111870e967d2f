"""Preemption, as a scheduler or a user sends it: real SIGTERM from outside and the launcher's
signals; every worker saves one step, and the same command resumes from it to the same model.
Ctrl-C typed in a real terminal, and a terminal closed: tests/test_terminal_signals.py."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import REPO, ROOT, SHELL_SIGNALS
from processes import (alive, child_env, children, launch, tf_config_of, train_command,
                       wait_for)
from terminal import Terminal
from tfdp.launcher.processes import free_ports
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
    The handler came first in a whole run, raised out of the run, and the watch, late on a
    loaded machine, then ended the process with a line that no longer named the run folder a
    default chose. Here the watch reads the two Ctrl-Cs after the handler's ``Interrupted``
    has left the run: only the handler's line, naming the folder, is said."""
    script = """if True:
        import os, signal, sys, time
        from tfdp.training import mid_step, preemption
        from tfdp.util import errors
        with preemption.preempt_outside_runs(), mid_step.mid_step_signals("tfdp.train"):
            wakeup = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(wakeup)
            try:
                with errors.naming_the_run("runs/manual-lenet-2dev"), preemption.Watch() as w:
                    w._on_signal(signal.SIGINT, None)
                    w._on_signal(signal.SIGINT, None)  # The handler's Interrupted.
            except errors.Interrupted as e:
                os.write(wakeup, bytes([signal.SIGINT, signal.SIGINT]))  # The watch, late.
                time.sleep(0.5)
                print(e, flush=True)
                sys.exit(errors.INTERRUPTED_EXIT_CODE)
    """
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert done.returncode == 130, (done.stdout, done.stderr)
    assert done.stdout.strip().endswith(
        "run the same command again with --workdir=runs/manual-lenet-2dev to resume from it"), \
        done.stdout
    assert "stopped at once" not in done.stderr, done.stderr


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


# --- The launcher and its workers ----------------------------------------------------------------

def launcher(data_dir, folder, *flags):
    return launch(folder, "multi_worker", f"--data_dir={data_dir}", *flags, popen=True)


def workers_of(pid, count=2):
    """The launcher's worker processes (its start-up watchdogs are their children, not its),
    once each runs its own program: between fork and exec a child still has the launcher's
    environment, without its TF_CONFIG."""
    def started():
        found = children(pid)
        return len(found) == count and all(tf_config_of(child) for child in found)

    wait_for(started, 60, "the workers")
    return children(pid)


@pytest.mark.cluster
@pytest.mark.skipif(not ROOT and not os.path.exists("/proc/self/ns/user"),
                    reason="needs root or user namespaces to isolate the workers")
def test_sigterm_to_one_worker_stops_every_worker_at_one_step_and_they_resume(tmp_path, data_dir):
    flags = ["--epochs=2", "--steps_per_epoch=100", "--batch_size=64", "--eval_steps=1"]
    run = launcher(data_dir, tmp_path, *flags)
    chief, other = workers_of(run.pid)
    # Isolated: the workers live in a network namespace of their own, and their servers
    # (which bind every interface) cannot be reached from this one.
    assert os.readlink(f"/proc/{other}/ns/net") != os.readlink("/proc/self/ns/net")
    config = json.loads(open(f"/proc/{other}/environ", "rb").read().split(b"TF_CONFIG=")[1]
                        .split(b"\0")[0])
    port = int(config["cluster"]["worker"][1].rsplit(":", 1)[1])
    backups = Backups(str(tmp_path / "run"), 1, {})
    wait_for(lambda: 100 in backups.steps() or run.poll() is not None, 240, "the first epoch")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    time.sleep(0.3)
    signalled = time.time()
    os.kill(other, signal.SIGTERM)  # One worker only: the other must stop at the same step.
    out, err = run.communicate(timeout=60)
    assert time.time() - signalled < 20
    assert run.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    steps = {worker: int(step) for worker, step in re.findall(
        r"^\[(\d)\] tfdp\.train: preempted \(SIGTERM\) at step (\d+): state of step \d+ saved",
        err, re.M)}
    assert set(steps) == {"0", "1"} and steps["0"] == steps["1"], err[-3000:]
    step = steps["0"]
    assert 100 <= step < 200
    assert "in a private network namespace" in err
    for index in (0, 1):
        assert step in Backups(str(tmp_path / "run"), index, {}).steps()
    assert not (tmp_path / "export").exists() or not os.listdir(tmp_path / "export")
    assert not alive(chief) and not alive(other)

    rerun = launcher(data_dir, tmp_path, *flags)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-3000:]
    assert f"[0] resuming at epoch 2/2, step {step - 100}/100 (global step {step})" in out
    digests = dict(re.findall(r"^\[\d\] final weights sha256 (\w+) \(worker (\d)\)", err, re.M))
    assert len(digests) == 1, err[-2000:]  # Both workers ended with the same weights.
    assert os.listdir(tmp_path / "export") == ["1"]


@pytest.mark.cluster
def test_a_sigterm_while_a_worker_waits_for_its_peer_stops_both_at_step_0(tmp_path, data_dir):
    """A ``multi_worker`` worker whose peer is late waits inside the strategy's creation, while
    TensorFlow's own SIGTERM handler is in place: a SIGTERM then waits for tfdp's handler (any
    thread but the main one took it, and it was lost: the run trained to its end, exit 0), and
    both workers stop at step 0 once the peer comes."""
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}

    def worker(index):
        env = child_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                              "task": {"type": "worker", "index": index}}))
        return subprocess.Popen(
            train_command(data_dir, tmp_path, "--strategy=multi_worker", "--num_gpus=1",
                          "--epochs=1", "--steps_per_epoch=40", "--batch_size=32",
                          "--eval_steps=1", "--collective_timeout=120"),
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=REPO)

    def serving(port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    first = worker(0)
    wait_for(lambda: serving(ports[0]) or first.poll() is not None, 120, "worker 0's server")
    first.send_signal(signal.SIGTERM)  # Worker 0 waits for worker 1 to register.
    time.sleep(1)
    second = worker(1)
    for process in (first, second):
        err = process.communicate(timeout=180)[1]
        assert process.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
        assert "tfdp.train: preempted (SIGTERM) at step 0: nothing new to save" in err, err[-3000:]


@pytest.mark.cluster
def test_sighup_to_the_launcher_preempts_and_sigkill_takes_the_workers_with_it(tmp_path,
                                                                              data_dir):
    """SIGHUP (its terminal closed, its ssh session lost) is a stop signal for the launcher as
    SIGTERM is (tests/test_resume_exactly.py sends that one to the parameter servers'
    launcher): every worker saves and the launcher exits 75."""
    run = launcher(data_dir, tmp_path, "--epochs=3", "--steps_per_epoch=100", "--batch_size=64",
                   "--eval_steps=1")
    backups = Backups(str(tmp_path / "run"), 0, {})
    wait_for(lambda: backups.steps() or run.poll() is not None, 240, "the first epoch")
    run.send_signal(signal.SIGHUP)
    out, err = run.communicate(timeout=60)
    assert run.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    assert "tfdp.launch: SIGHUP; asking the workers to save and stop" in err, err[-3000:]
    assert len(re.findall(r"^\[\d\] tfdp\.train: preempted", err, re.M)) == 2, err[-3000:]

    # SIGKILL cannot be caught: the kernel ends the workers with their launcher.
    run = launcher(data_dir, tmp_path / "killed", "--epochs=1")
    workers = workers_of(run.pid)
    run.kill()
    run.communicate(timeout=30)
    wait_for(lambda: not any(alive(w) for w in workers), 10, "the orphaned workers to die")


@pytest.mark.cluster
@pytest.mark.parametrize("times", [1, 2])
def test_ctrl_c_in_a_terminal_reaches_the_launcher_which_has_every_worker_save(tmp_path,
                                                                               data_dir, times):
    """A real pseudo-terminal: Ctrl-C there signals the terminal's foreground process group,
    the launcher's; the workers, in sessions of their own, are asked by the launcher, and all
    saved is a preemption (75). A second Ctrl-C, typed while they finish a step (a large
    batch: seconds here), stops them at once (130), naming the run folder the workers chose."""
    batch = 8192 if times == 2 else 64
    workdir = [f"--workdir={tmp_path / 'run'}"] if times == 1 else []  # Else the default one.
    run = Terminal(
        [sys.executable, "-m", "tfdp.launch", "--num_workers=2", "--", "--strategy=multi_worker",
         "--epochs=3", "--steps_per_epoch=100", f"--batch_size={batch}", "--eval_steps=1",
         f"--data_dir={data_dir}", *workdir, f"--export_dir={tmp_path / 'export'}"],
        cwd=tmp_path)
    backups = Backups(str(tmp_path / "run"), 0, {})
    if times == 2:  # Into the first epoch's long steps.
        run.wait_for(lambda t: "\r[0] epoch 1/3 " in t.text, 240, "training")
    else:
        run.wait_for(lambda t: backups.steps(), 240, "the first epoch")
    run.type(b"\x03")  # Ctrl-C, typed.
    if times == 2:
        run.wait_for(lambda t: "asking the workers to save" in t.text, 10, "the first Ctrl-C")
        run.type(b"\x03")
    returncode = run.finish(60)
    text = run.text
    assert "tfdp.launch: interrupted; asking the workers to save and stop" in text
    if times == 2:
        assert returncode == 130, text[-3000:]
        folder, = os.listdir(tmp_path / "runs")
        assert text.rstrip().splitlines()[-1] == (
            "tfdp.launch: stopped at once (a second Ctrl-C): the steps since the newest backup "
            f"are lost; run the same command again with --workdir=runs/{folder} to resume "
            "from it")
        assert "did not stop; killing it" not in text
        return
    assert returncode == PREEMPTED_EXIT_CODE, text[-3000:]
    assert len(re.findall(r"\[\d\] tfdp\.train: preempted \(SIGTERM\) at step", text)) == 2
    assert "\r[0] epoch 1/3 " in text  # The chief's live progress line, in a terminal.
    assert "Traceback" not in text


# Each thread but the main one, after tfdp has imported TensorFlow: whether SIGTERM is open.
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
