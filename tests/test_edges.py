"""Signals at the edges of a run, sent from outside as a scheduler or a supervisor sends them:
in an epoch's last steps, before and after the export, to a run that has finished and is run
again, and to one server of the from-scratch cluster. Whenever one lands, the same command run
until it succeeds records every epoch once and exports once."""

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import REPO
from processes import child_env, launch, run_train, task_pid, train_command, wait_for
from tfdp.training.backups import Backups
from tfdp.util.errors import PREEMPTED_EXIT_CODE


class Lines:
    """A running process's merged output, read as it comes (``seen``: the lines so far)."""

    def __init__(self, proc):
        self.proc, self.seen = proc, []
        self._reader = threading.Thread(target=lambda: self.seen.extend(proc.stdout),
                                        daemon=True)
        self._reader.start()

    @classmethod
    def of(cls, command):
        return cls(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env=child_env(), cwd=REPO))

    def wait_for(self, pattern, seconds):
        wait_for(lambda: any(re.search(pattern, line) for line in self.seen)
                 or self.proc.poll() is not None, seconds, pattern)

    def finish(self, seconds=120) -> str:
        self.proc.wait(timeout=seconds)
        self._reader.join(timeout=10)
        return "".join(self.seen)


@pytest.mark.slow
@pytest.mark.parametrize("moment, delay", [
    ("^mirrored: ", 0.0),  # The plan line: building, compiling, then epoch 1's first steps.
    ("^epoch 1/3: ", 1.0),  # Into epoch 2's steps (each a large batch: some 0.5 s here).
    ("^exported ", 0.0),  # The export is published; the process has yet to exit.
])
def test_a_sigterm_at_any_moment_of_a_keras_run_loses_no_epoch_and_a_finished_run_stays_so(
        tmp_path, data_dir, moment, delay):
    """Epochs of 5 steps, the Keras path's checks every 5th step: a signal in an epoch's steps
    is seen at its last step. Whenever it lands, the same command run until it succeeds records
    every epoch once and exports once; a signal after the export is a clean exit, and the finished
    run run again says so, trains and exports nothing, and leaves no lock behind."""
    command = train_command(data_dir, tmp_path, "--strategy=mirrored", "--num_gpus=2",
                            "--epochs=3", "--steps_per_epoch=5", "--batch_size=2048",
                            "--eval_steps=1")
    run = Lines.of(command)
    run.wait_for(moment, 180)
    time.sleep(delay)
    run.proc.send_signal(signal.SIGTERM)
    out = run.finish()
    assert "Traceback" not in out, out[-3000:]
    if moment == "^exported ":
        assert run.proc.returncode == 0, out[-3000:]
    else:
        assert run.proc.returncode in (0, PREEMPTED_EXIT_CODE), out[-3000:]
    for attempt in range(2):
        if run.proc.returncode == 0:
            break
        run = Lines.of(command)
        out = run.finish()
        assert run.proc.returncode in (0, PREEMPTED_EXIT_CODE), out[-3000:]
    assert run.proc.returncode == 0, out[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [r["epoch"] for r in metrics["epochs"]] == [1, 2, 3], out[-3000:]
    assert os.listdir(tmp_path / "export") == ["1"]
    if moment != "^exported ":  # A finished run run again: once, after the last moment.
        return

    again = run_train(command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().splitlines() == [
        f"tfdp.train: the run in {tmp_path / 'run'} has finished (exported "
        f"{tmp_path / 'export' / '1'}): nothing to train or export; give a new --workdir to "
        "train again"]
    assert os.listdir(tmp_path / "export") == ["1"]
    assert json.loads((tmp_path / "run" / "metrics.json").read_text()) == metrics
    assert not [n for n in os.listdir(tmp_path / "run") if n.startswith(".lock")]


@pytest.mark.cluster
@pytest.mark.parametrize("moment", ["starting", "training"])
def test_sigterm_to_one_server_preempts_the_from_scratch_cluster_and_the_same_command_resumes(
        tmp_path, data_dir, moment):
    """SIGTERM from outside to worker 1's tfdp.server, as its scheduler sends it: as the chief
    starts its first steps, or mid-epoch. The chief saves the step every replica finished and
    exits 75, naming the worker; the server waits for that, then exits 75; the launcher exits
    75; the same command resumes from that step."""
    # Three epochs: the chief reads its servers' flags once a second, and an epoch may take
    # less (seen: 0.9 s), so a signal in the last epoch could come after its last read.
    flags = ["--epochs=3", "--steps_per_epoch=100", "--batch_size=64", "--eval_steps=1"]
    run = Lines(launch(tmp_path, "manual", f"--data_dir={data_dir}", *flags, popen=True,
                       stderr=subprocess.STDOUT))
    if moment == "starting":
        run.wait_for(r"^\[chief\] manual: ", 240)
    else:
        backups = Backups(str(tmp_path / "run"), 0, {})
        wait_for(lambda: 100 in backups.steps() or run.proc.poll() is not None, 240,
                 "the first epoch")
        time.sleep(0.3)
    os.kill(task_pid(run.proc.pid, "worker", 1), signal.SIGTERM)
    out = run.finish()
    assert run.proc.returncode == PREEMPTED_EXIT_CODE, out[-3000:]
    stopped = re.search(r"^\[chief\] tfdp\.train: preempted \(SIGTERM to worker 1 at "
                        r"127\.0\.0\.1:\d+\) at step (\d+): (state of step \1 saved in "
                        r"|nothing new to save)", out, re.M)
    assert stopped, out[-3000:]
    step = int(stopped[1])
    assert (stopped[2] == "nothing new to save") == (step == 0), out[-3000:]  # Before a step.
    assert re.search(r"^\[1\] tfdp\.server: preempted \(SIGTERM\); the chief at \S+ has "
                     r"stopped$", out, re.M), out[-3000:]
    assert "Traceback" not in out and "lost contact" not in out, out[-3000:]
    assert not (tmp_path / "export").exists() or not os.listdir(tmp_path / "export")

    rerun = launch(tmp_path, "manual", f"--data_dir={data_dir}", *flags)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    epoch, offset = divmod(step, 100)
    if step:  # Signalled as the chief starts: it may stop before its first step.
        assert (f"[chief] resuming at epoch {epoch + 1}/3, step {offset}/100 (global step "
                f"{step})" in rerun.stdout), rerun.stdout[-2000:]
    assert os.listdir(tmp_path / "export") == ["1"]
