"""``python -m tfdp.launch --num_workers=MIN:MAX`` (issue 62, its first part): a multi_worker
group that loses a worker goes on with the others, without the user, and ends on the model of
a run never interrupted (float64), since the global batch and the data order stay the run's.
Real processes, a real SIGKILL from outside to a random worker at a random step."""

import json
import os
import random
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from processes import backed_up, children, launch, run_module, tf_config_of, wait_for
from same_model import served_logits
from tfdp.config.settings import Config
from tfdp.training import entry

STEPS = 24  # Steps per epoch, two epochs; backups every 4 steps.
SETTINGS = dict(precision="float64", epochs=2, steps_per_epoch=STEPS, batch_size=48, lr=0.1,
                eval_steps=1, seed=4)


@pytest.mark.cluster
def test_a_group_that_loses_a_worker_goes_on_without_it_and_trains_the_same_model(
        tmp_path, data_dir, test_split):
    """Three workers of ``--num_workers=2:3`` (16 examples each a step), one SIGKILLed once every
    worker has backed up a random step: the launcher says who left and goes on with two (24
    each), which resume from the newest backup every worker has, finish, export once and leave
    no backup behind; the model is the one two devices train, never interrupted."""
    run = launch(tmp_path, "multi_worker", f"--data_dir={data_dir}", "--backup_every=4",
                 *[f"--{k}={v}" for k, v in SETTINGS.items()], launcher=("--num_workers=2:3",),
                 popen=True, stderr=subprocess.STDOUT)
    out = []
    reader = threading.Thread(target=lambda: out.extend(run.stdout), daemon=True)
    reader.start()
    chosen = random.Random()
    step = chosen.randrange(4, 2 * STEPS - 8)
    wait_for(lambda: backed_up(tmp_path / "run", 3) >= step or run.poll() is not None, 300,
             f"every worker's backup of step {step}")
    seen = backed_up(tmp_path / "run", 3)
    workers = {task_of["task"]["index"]: pid for pid in children(run.pid)
               if (task_of := tf_config_of(pid))}
    assert sorted(workers) == [0, 1, 2], workers
    victim = chosen.choice(sorted(workers))
    os.kill(workers[victim], signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: any("resuming at" in line for line in out) or run.poll() is not None, 300,
             "the group to re-form")
    took = time.monotonic() - killed
    assert run.wait(300) == 0, "".join(out)[-3000:]
    reader.join(10)
    text = err = "".join(out)
    assert re.search(rf"^tfdp\.launch: worker {victim} left \(exited with -9\); going on with 2 "
                     r"of --num_workers=2:3: the group re-forms from the newest backup every "
                     r"worker has, at the same global batch$", err, re.M), err[-3000:]
    assert re.search(r"^tfdp\.launch: 2 workers at 127\.0\.0\.1:\d+, 127\.0\.0\.1:\d+, ", err,
                     re.M), err[-3000:]
    resumed = re.search(r"^\[0\] resuming at epoch (\d)/2, step (\d+)/24 \(global step (\d+)\)",
                        text, re.M)
    assert resumed and int(resumed[3]) >= seen, (seen, text[-3000:])
    assert "global batch 48 = 24 + 24 per replica" in err, err[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [r["epoch"] for r in metrics["epochs"]] == [1, 2]
    assert os.listdir(tmp_path / "export") == ["1"]
    assert not (tmp_path / "run" / "backup").exists()  # The departed worker's too.
    print(f"re-formed and resuming {took:.1f} s after the loss")

    reference = entry.train(Config(strategy="mirrored", num_gpus=2, data_dir=data_dir,
                                   workdir=str(tmp_path / "whole"),
                                   export_dir=str(tmp_path / "whole-export"), **SETTINGS))
    ours = served_logits(tmp_path / "export" / "1", test_split.images[:256])
    theirs = served_logits(reference.export_path, test_split.images[:256])
    assert np.abs(ours - theirs).max() <= 1e-6, (
        f"worker {victim} killed at step {seen}: {np.abs(ours - theirs).max():.3g} away in the "
        "logits from two devices never interrupted")


@pytest.mark.parametrize("launcher, train, line", [
    (["--num_workers=3:2"], ["--strategy=multi_worker"],
     "--num_workers=3:2: the workers must be a positive integer, or MIN:MAX with 1 <= MIN <= MAX"),
    (["--num_workers=1:2"], ["--strategy=manual"],
     "--num_workers=1:2 re-forms a --strategy=multi_worker group; --strategy=manual's workers "
     "are tfdp.servers of one client: give a number"),
    (["--num_workers=1:2"], ["--strategy=parameter_server"],
     "--num_workers=1:2 re-forms a --strategy=multi_worker group; --strategy=parameter_server's "
     "workers are tfdp.servers of one client (a lost one is started again already): give a "
     "number"),
    (["--num_workers=1:2"], ["--strategy=multi_worker", "--per_replica_batch_size=32"],
     "--num_workers=1:2 keeps the global batch whatever the group's size, so that the model is "
     "the same: give the workers --batch_size (the global batch) instead of "
     "--per_replica_batch_size"),
    (["--num_workers=1:2"], ["--strategy=multi_worker", "--backup_every=0"],
     "--num_workers=1:2 re-forms the group from the newest backup: --backup_every=0 would redo "
     "whole epochs; give it steps or seconds"),
])
def test_what_a_group_cannot_do_is_refused_in_one_line_before_anything_starts(launcher, train,
                                                                             line):
    done = run_module("tfdp.launch", *launcher, "--", *train, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"tfdp.launch: error: {line}", done.stderr
