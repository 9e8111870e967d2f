"""Stopped at a random step of a random epoch, then resumed: the same model as a run that was
never interrupted, on every path, and with your own model from scratch. In float64 (no rounding
to hide behind) with everything a run's state holds: momentum's velocities (Nesterov), Adam's
moments, the weights' averages (``--ema``), batch normalization's statistics, Dropout's seed
states, a one-cycle rate, flips.

Two kinds of stop, each a real signal from outside, sent once the run's own progress line shows
the chosen step: a preemption (SIGTERM: the run saves the step it stops at, and its line says
which, inside the epoch), and a hard stop (SIGKILL, to the process, to one task of a cluster
or to a parameter-server run's chief, with nothing saved then: the run resumes from its newest backup within the epoch,
``--backup_every``, written behind training)."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import REPO
from processes import (backed_up_steps, child_env, children, task_pid, tf_config_of,
                       train_command, train_in_this_process, wait_for)
from same_model import served_logits
from tfdp import paths
from tfdp.util.errors import PREEMPTED_EXIT_CODE

ZOO = os.path.join(REPO, "tests", "own_models", "zoo.py")
DROPOUT = ZOO + ":dropout_cnn"
# A subclassed model with Dropout and BatchNormalization, as Keras' guides write one.
SUBCLASSED = ZOO + ":subclassed"
# Steps per epoch; two epochs. The signal comes in the first 16 steps of one: the from-scratch
# path's progress line comes as a call of 16 steps is read, once the next is issued, and the stop
# that follows it must still be inside the epoch.
STEPS = 48
FLAGS = ("--recipe=fast", "--precision=float64", "--epochs=2", f"--steps_per_epoch={STEPS}",
         "--batch_size=32", "--lr=0.1", "--eval_steps=1")
EMA = "--ema=0.9"

# How each case is started, with its own flags. Who gets the SIGTERM: the process itself, one
# worker of a launched cluster (every worker must stop at its step), or the launcher (which
# passes it on to its chief).
PATHS = {
    "manual": ("train", ["--num_gpus=2", EMA]),
    "mirrored": ("train", ["--num_gpus=2", EMA]),
    "plain": ("train", [EMA]),
    "multi_worker": ("launch", ["--num_workers=2"], [EMA]),
    # The from-scratch path across machines: a client and two tfdp.server workers of one
    # device each, the global batch and data order of two local devices.
    "manual-cluster": ("launch", ["--num_workers=2"], [EMA]),
    # One worker: asynchronous SGD with two is not reproducible step for step. The recipe
    # keeps no momentum and no averages here (tfdp.config.recipes), so its state is the weights.
    "parameter_server": ("launch", ["--num_workers=1", "--num_ps=1"], []),
    # The same, stopped hard: its chief (the coordinator, which keeps the backups) killed.
    "parameter_server-killed": ("launch", ["--num_workers=1", "--num_ps=1"], []),
    # Your model from scratch, its state its variables: batch normalization's statistics and
    # Dropout's seed states, with Adam's moments and step count and the averages. It asks for a
    # stop every 4 steps, not the path's 16: a progress line comes as a call's steps are read,
    # after the loop has issued the next call, so at 16 a line two calls from the epoch's end
    # left no check before it on a machine that trains an epoch in 0.4 s (the stop then came at
    # the epoch's end: global step 192 of 96-step epochs, asked at epoch 2, step 38).
    "manual-yours": ("train", ["--num_gpus=2", EMA, f"--model={SUBCLASSED}",
                               "--optimizer=adam", "--lr=0.002", "--sync_every=4"]),
    # Dropout and every other seeded layer (their seed states), with AdamW's moments, under fit.
    "mirrored-dropout-adamw": ("train", ["--num_gpus=2", f"--model={DROPOUT}",
                                         "--optimizer=adamw", "--lr=0.002"]),
}
# The cases stopped hard (SIGKILL), backing up every few steps within an epoch; the others are
# preempted (SIGTERM).
HARD = {"manual", "plain", "multi_worker", "manual-cluster", "parameter_server-killed",
        "mirrored-dropout-adamw"}
BACKUP_EVERY = 8
# The run never interrupted that a case's resumed run must equal, where it is another case's or
# another run's: two multi_worker workers train exactly mirrored's model on two devices
# (measured: the same logits), two tfdp.server workers the from-scratch path's on two devices,
# and one parameter-server worker (its steps in order) the from-scratch path's on one device
# with the choices that path makes of the recipe; each trained in the test process instead of a
# launched cluster. The cases that share a reference run on one worker (xdist_group), which
# trains it once.
AS_PARAMETER_SERVER = "manual-as_parameter_server"
REFERENCE_ONLY = {AS_PARAMETER_SERVER: ("train", ["--num_gpus=1", *(
    f"--{name}={value}" for name, value in
    paths.get("parameter_server").recipe_overrides["fast"].items())])}
REFERENCE = {"multi_worker": "mirrored", "manual-cluster": "manual",
             "parameter_server": AS_PARAMETER_SERVER,
             "parameter_server-killed": AS_PARAMETER_SERVER}


def _case(case):
    reference = REFERENCE.get(case, case)
    if reference in REFERENCE.values():  # Its reference run is another case's too.
        return pytest.param(case, marks=pytest.mark.xdist_group(f"resume_like_{reference}"))
    return case


CASES = [_case(case) for case in PATHS]


_REFERENCE_LOGITS = {}  # A reference run's folder -> its export's logits of the test images.


_PROGRESS = re.compile(r"(\[\w+\] )?epoch \d+/\d+ +\d+/\d+ ")


class Started:
    """A run's process with its output read as it comes (progress lines included)."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=child_env(TFDP_LIVE_PROGRESS="1"), cwd=REPO)
        self.output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        while chunk := self.proc.stdout.read1(65536):
            self.output.extend(chunk)

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    @property
    def said(self) -> str:
        """``text`` without its progress redraws: what a failure shows."""
        return "\n".join(line for line in re.split(r"[\r\n]+", self.text)
                         if line.strip() and not _PROGRESS.match(line))

    def finish(self, seconds=300) -> int:
        try:
            self.proc.wait(seconds)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(10)
        return self.proc.returncode


def command(case, folder, data_dir):
    """``case``'s command (``PATHS``: its strategy is its name up to a "-")."""
    how, *flags = {**PATHS, **REFERENCE_ONLY}[case]
    strategy = case.split("-")[0]
    if how == "train":
        return train_command(data_dir, folder, f"--strategy={strategy}", *FLAGS, *flags[0])
    launcher, train_flags = flags
    return [sys.executable, "-m", "tfdp.launch", *launcher, "--", f"--strategy={strategy}",
            f"--data_dir={data_dir}", f"--workdir={folder / 'run'}",
            f"--export_dir={folder / 'export'}", *FLAGS, *train_flags]


@pytest.fixture(scope="module")
def never_interrupted(tmp_path_factory, data_dir):
    """``never_interrupted(reference)``: the export folder's parent of ``reference``'s run never
    interrupted (a case of one process, or ``REFERENCE_ONLY``'s), trained once per test
    process, in it."""
    folders = {}

    def trained(strategy):
        if strategy not in folders:
            folder = tmp_path_factory.mktemp(f"whole-{strategy}")
            argv = command(strategy, folder, data_dir)
            assert train_in_this_process(argv[2:]) is None, strategy
            folders[strategy] = folder
        return folders[strategy]
    return trained


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", CASES)
def test_stopped_at_a_random_step_and_resumed_equals_never_interrupted(
        tmp_path, data_dir, test_split, never_interrupted, strategy):
    chosen = random.Random()
    epoch, step = chosen.choice([1, 2]), chosen.randrange(1, 17)
    moment = f"epoch {epoch}, step {step}"
    stopped_folder = tmp_path / "stopped"
    hard = strategy in HARD
    argv = command(strategy, stopped_folder, data_dir) + (
        [f"--backup_every={BACKUP_EVERY}"] if hard else [])
    first = (epoch - 1) * STEPS

    run = Started(argv)
    progress = re.compile(rf"epoch {epoch}/2 +(\d+)/{STEPS} ")
    workers = 2 if strategy == "multi_worker" else 1  # The tasks that keep backups.
    backed_up = lambda: within_epoch(stopped_folder / "run" / "backup", workers, first)  # noqa
    wait_for(lambda: (any(int(k) >= step for k in progress.findall(run.text))
                      and (not hard or backed_up()))
             or run.proc.poll() is not None, 300, f"{strategy} to reach {moment}")
    seen = backed_up() if hard else None
    if strategy in ("multi_worker", "manual-cluster"):
        pids = [pid for pid in children(run.proc.pid) if tf_config_of(pid)]
        target = chosen.choice(pids)  # One task: every worker must stop at one step.
    elif strategy == "parameter_server-killed":
        target = task_pid(run.proc.pid, "chief", 0)
    else:
        target = run.proc.pid
    os.kill(target, signal.SIGKILL if hard else signal.SIGTERM)
    returncode = run.finish()
    text, said = run.text, run.said
    assert "Traceback" not in text
    assert not os.path.exists(stopped_folder / "export" / "1")
    if hard:  # Nothing saved at the kill: the newest backup every worker has, within the epoch.
        assert returncode not in (0, PREEMPTED_EXIT_CODE), (moment, said[-3000:])
        # The newest of all, not only within the epoch: a survivor's save must not pass it.
        saved = max(backed_up_steps(stopped_folder / "run", workers))
        assert seen <= saved < first + STEPS, (moment, seen, saved, said[-1500:])
    else:
        assert returncode == PREEMPTED_EXIT_CODE, (moment, said[-3000:])
        stops = {int(s) for s in re.findall(r"tfdp\.train: preempted \(SIGTERM\) at step "
                                            r"(\d+): state of step \1 saved in ", text)}
        assert len(stops) == 1, (moment, said[-3000:])
        saved = stops.pop()
        assert first + step <= saved < first + STEPS, (
            f"asked at {moment}, stopped at global step {saved}: not inside epoch {epoch}")

    resumed = Started(argv)
    assert resumed.finish() == 0, resumed.said[-3000:]
    assert (f"resuming at epoch {epoch}/2, step {saved - first}/{STEPS} (global step {saved})"
            in resumed.text), (seen, said[-1500:], resumed.said[-3000:])
    assert f"epoch {epoch}/2: loss" in resumed.text and (epoch == 1 or "epoch 1/2: loss"
                                                         not in resumed.text)
    history = json.loads((stopped_folder / "run" / "metrics.json").read_text())["epochs"]
    assert [r["epoch"] for r in history] == [1, 2]
    assert not (stopped_folder / "run" / "backup").exists()  # Spent once the run is complete.

    whole_folder = never_interrupted(REFERENCE.get(strategy, strategy))
    images = test_split.images[:256]
    ours = served_logits(stopped_folder / "export" / "1", images)
    theirs = _REFERENCE_LOGITS.get(whole_folder)
    if theirs is None:  # Served once for the cases that share a reference.
        theirs = _REFERENCE_LOGITS[whole_folder] = served_logits(whole_folder / "export" / "1",
                                                                 images)
    assert np.abs(ours - theirs).max() <= 1e-6, (
        f"{strategy} preempted at global step {saved} ({moment}) and resumed ends "
        f"{np.abs(ours - theirs).max():.3g} away in the logits from a run never interrupted "
        f"({REFERENCE.get(strategy, strategy)})")


def within_epoch(backup, workers: int, first: int):
    """The newest step after ``first`` (an epoch's first) that every one of ``workers`` has a
    backup of in ``backup``, or None."""
    inside = [k for k in backed_up_steps(backup.parent, workers) if first < k < first + STEPS]
    return max(inside) if inside else None
