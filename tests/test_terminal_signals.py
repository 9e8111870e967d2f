"""Signals from a real terminal: Ctrl-C typed into a pseudo-terminal at every moment of a run
(while the command imports its modules, at its start, mid-epoch, twice), and the terminal
closed under a run (tmux: SIGHUP). Each is a preemption; a second Ctrl-C stops at once. The
signals of schedulers and of the launcher: tests/test_preemption.py and
tests/test_launcher_preemption.py."""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from processes import alive, child_env, run_train, train_command, wait_for
from terminal import Terminal
from tfdp.training.backups import Backups
from tfdp.util.errors import PREEMPTED_EXIT_CODE


# --- Ctrl-C in a terminal -----------------------------------------------------------------------

@pytest.mark.parametrize("signum, by", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM"),
                                        (signal.SIGHUP, "SIGHUP")])
def test_a_signal_while_the_command_imports_its_modules_ends_it_in_its_one_line(signum, by):
    """``python -m tfdp.train`` as ``-m`` runs it, the signal sent the moment the command starts
    to import its modules (on a loaded machine a Ctrl-C typed in its first seconds landed there
    and came out of the import machinery as a traceback): held, then the one line, exit 75."""
    # SIGHUP as a terminal's process has it (a harness may start the suite with it ignored,
    # as nohup does, and tfdp leaves an ignored SIGHUP ignored).
    code = ("import os, runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
            "from tfdp.training import preemption; "
            "hold = preemption.hold_until_main; "
            f"preemption.hold_until_main = lambda: (hold(), os.kill(os.getpid(), {int(signum)})); "
            "sys.argv = ['tfdp.train']; runpy.run_module('tfdp.train', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(), cwd=REPO, timeout=120)
    assert done.returncode == PREEMPTED_EXIT_CODE, done.stderr[-3000:]
    assert done.stderr.strip() == (f"tfdp.train: preempted ({by}) at step 0: nothing new to "
                                   "save; run the same command again to resume")


@pytest.mark.slow
@pytest.mark.parametrize("strategy, moment", [  # The start and a second Ctrl-C: every path's.
    ("manual", "starting"), ("manual", "training"), ("mirrored", "training"), ("manual", "twice")])
def test_ctrl_c_in_a_terminal_saves_like_sigterm_and_a_second_stops_at_once(
        tmp_path, data_dir, strategy, moment):
    """Typed into a real pseudo-terminal: at four moments of the start (nothing to save, or the
    first steps), mid-epoch (the step under way finishes and is saved; the same command
    resumes), and twice mid-step (steps of a large batch: the second stops at once, one line,
    exit 130)."""
    batch = 4096 if moment == "twice" else 64  # Steps long enough to type twice during one.
    command = train_command(data_dir, tmp_path, f"--strategy={strategy}", "--num_gpus=2",
                            "--epochs=1", "--steps_per_epoch=400", f"--batch_size={batch}",
                            "--eval_steps=1")
    if strategy == "manual" and moment != "starting":  # The default run folder, new each run.
        command = [arg for arg in command if not arg.startswith("--workdir=")]
    if moment == "starting":
        # Python's start, TensorFlow's import, TFDS' import, the data, the replicas: whatever
        # was running, one line. (TFDS' __init__ swallows any Exception: a Ctrl-C there once
        # left it half-imported, and a traceback followed.)
        # Started as Python starts it, not forked from the suite's zygote (tests/zygote.py):
        # forked, every delay but the first landed in training, and the first in the fork's
        # own set-up (a KeyboardInterrupt there, the zygote's, not tfdp's).
        for delay in (0.3, 1.2, 2.1, 3.0):
            run = Terminal(command, env=child_env(TFDP_TEST_FORK="0"))
            time.sleep(delay)
            run.type(b"\x03")
            returncode = run.finish(60)
            assert "Traceback" not in run.text and "KeyboardInterrupt" not in run.text, run.text
            endings = re.findall(r"(?m)^tfdp\.train: [^\r\n]*", run.text)
            assert len(endings) == 1 and re.match(
                r"tfdp\.train: preempted \(Ctrl-C\) at step (0: nothing new to save|\d+: state of "
                r"step \d+ saved in )", endings[0]), (delay, run.text[-3000:])
            assert returncode == PREEMPTED_EXIT_CODE, (delay, run.text[-3000:])
        return
    for attempt in range(3):
        run = Terminal(command, cwd=tmp_path)
        run.wait_for(lambda t: re.search(r"\repoch 1/1 +\d+/\d+ ", t.text), 120, "training")
        run.type(b"\x03")
        if moment == "twice":
            time.sleep(0.2)
            run.type(b"\x03")
        returncode = run.finish(60)
        text = run.text
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
        endings = re.findall(r"(?m)^tfdp\.train: [^\r\n]*", text)
        assert len(endings) == 1, text[-3000:]
        # How to resume: the same command, given the run's folder if a default chose it.
        folder = "run" if strategy == "mirrored" else os.path.join("runs", *os.listdir(
            tmp_path / "runs"))
        again = "again" if strategy == "mirrored" else f"again with --workdir={folder}"
        if moment != "twice" or returncode != PREEMPTED_EXIT_CODE:
            break
        # The first Ctrl-C's step ended and its state was saved within the 0.2 s: the second
        # then has nothing to cut short and is ignored (the run says where it saved, exit 75).
        # Seen in a whole run; a step of this batch takes far longer, so again.
        assert re.match(r"tfdp\.train: preempted \(Ctrl-C\) at step \d+: state of step \d+ "
                        rf"saved in \S+; run the same command {again} to resume", endings[0]), \
            endings
        shutil.rmtree(tmp_path / "runs")
    if moment == "twice":
        assert returncode == 130, text[-3000:]
        assert endings[0] == ("tfdp.train: stopped at once (a second Ctrl-C): the steps since "
                              f"the newest backup are lost; run the same command {again} to "
                              "resume from it"), endings
        assert not os.path.exists(tmp_path / "export" / "1")
        return
    assert returncode == PREEMPTED_EXIT_CODE, text[-3000:]
    step = int(re.match(r"tfdp\.train: preempted \(Ctrl-C\) at step (\d+): state of step \d+ "
                        rf"saved in \S+; run the same command {again} to resume",
                        endings[0])[1])
    assert 0 < step < 400
    assert Backups(str(tmp_path / folder), 0, {}).steps() == [step]
    resumed = run_train(command + [f"--workdir={folder}"] * (strategy == "manual"), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming at epoch 1/1, step {step}/400 (global step {step})" in resumed.stdout
    assert "exported " in resumed.stdout


# --- A closed terminal ----------------------------------------------------------------------------

@pytest.mark.cluster
@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")
def test_a_closed_terminal_saves_the_step_and_the_same_command_resumes(tmp_path, data_dir):
    """A run in a real terminal (tmux), which is closed in the middle of its epoch: SIGHUP is a
    preemption, so the run saves its step inside the epoch (by default it would die with
    everything since the last backup), though the terminal it writes to has gone; the same
    command resumes there."""
    tmux = ["tmux", "-S", str(tmp_path / "tmux")]  # A tmux server of the test's own.
    argv = train_command(data_dir, tmp_path, "--num_gpus=2", "--epochs=1",
                         "--steps_per_epoch=400", "--batch_size=128", "--eval_steps=1")
    subprocess.run(tmux + ["new-session", "-d", "-s", "run", "-x", "200", "-y", "20", "-c", REPO,
                           "exec " + " ".join(shlex.quote(a) for a in argv)],
                   check=True, timeout=30, env=child_env(TFDP_LIVE_PROGRESS="1"))
    try:
        pane = subprocess.run(tmux + ["list-panes", "-t", "run", "-F", "#{pane_pid}"],
                              capture_output=True, text=True, check=True, timeout=30)
        pid = int(pane.stdout.split()[0])  # The run itself: the shell exec'd it.

        def screen():
            return subprocess.run(tmux + ["capture-pane", "-p", "-t", "run"],
                                  capture_output=True, text=True, timeout=30).stdout

        progress = re.compile(r"epoch 1/1 +(\d+)/400 ")
        wait_for(lambda: any(int(k) >= 20 for k in progress.findall(screen())), 240,
                 "the first epoch's 20th step on the terminal")
    finally:
        subprocess.run(tmux + ["kill-server"], timeout=30)  # The terminal closes.
    wait_for(lambda: not alive(pid), 120, "the run to save and exit")
    steps = Backups(str(tmp_path / "run"), 0, {}).steps()
    assert steps and 20 <= steps[-1] < 400, steps  # Saved inside the epoch.
    resumed = run_train(argv)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (f"resuming at epoch 1/1, step {steps[-1]}/400 (global step {steps[-1]})"
            in resumed.stdout), resumed.stdout[-3000:]
