"""The from-scratch path across machines: ``tfdp.server`` workers and a ``tfdp.train`` client,
real processes on loopback (``tfdp.launch``) or by hand, and on emulated hosts (root)."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

import readme
from conftest import REPO
from processes import child_env, left_behind, run_module, wait_for_first_backup
from same_model import comparable_start, served_disagreement, train_manual
from traces import lanes_by_step
from processes import launch as launch_cluster
from tfdp.config.settings import Config
from tfdp.launcher.processes import free_ports
from tfdp.training.backups import Backups

pytestmark = pytest.mark.cluster


def launch(tmp_path, *train_args, **how):
    return launch_cluster(tmp_path, "manual", *train_args, **how)


def test_two_workers_train_the_model_two_local_devices_train(tmp_path, data_dir, train_split,
                                                             test_split):
    # Float64, so the comparison is exact on any CPU; an odd batch, so the micro-batches of the
    # accumulated updates are uneven (48 + 47); windows of 4 steps and a short one of 2.
    start = comparable_start(4, np.float64)
    np.savez(tmp_path / "start.npz", **start)
    settings = dict(batch_size=95, lr=0.1, epochs=2, steps_per_epoch=6, eval_steps=2, seed=3,
                    data_dir=data_dir, precision="float64", accumulate_steps=2, sync_every=4,
                    allreduce="ring")
    launcher, readmes = readme.launch_args("manual")  # The README's launch, and more.
    result = launch(tmp_path, *readmes, f"--init={tmp_path / 'start.npz'}", "--trace_steps=5:6",
                    "--plots", *[f"--{k}={v}" for k, v in settings.items()], launcher=launcher)
    assert result.returncode == 0, result.stderr[-4000:]
    # The client traced itself and captured the servers' profiles: each worker's replica has
    # its lane with every phase in each traced step, cut by the client's step boundaries.
    found = lanes_by_step(json.loads((tmp_path / "run" / "timeline.json").read_text()))
    for worker in (0, 1):
        for step in (5, 6):
            assert {"forward", "backward", "communication", "update"} <= found[
                (f"worker {worker}", f"replica {worker}", step)], (worker, step)
            # The ring's chunks arrive after the worker's own backward pass: waited for.
            assert "communication" in found[(f"worker {worker}", "receives", step)]
    assert {k[2] for k in found} == {5, 6}
    out, err = result.stdout, result.stderr
    remote = [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in (0, 1)]
    assert "2 remote device(s) on worker 0 (127.0.0.1:" in err and str(remote) in err, err
    assert ("global batch 190 = 95 + 95 per replica, accumulated from 2 micro-batches of 95 "
            "(steps below are updates)") in err
    assert re.search(r"^\[chief\] data: 60000 training and 10000 test examples, read by each of "
                     r"the 2 workers from its own ", err, re.M), err
    for i in (0, 1):
        assert f"[{i}] tfdp.server: worker {i} at 127.0.0.1:" in out
    assert sum(l.startswith("[chief] epoch ") for l in out.splitlines()) == 2
    assert "[chief] test acc (first 190 of 10000 test examples):" in out
    assert not re.search(r"^\[\w+\] ([IWE]\d{4} |Traceback)", err, re.M), err[-3000:]
    assert os.listdir(tmp_path / "export") == ["1"]
    drawn = sorted(p.name for p in (tmp_path / "run").glob("*.png"))  # By the client (--plots).
    assert {"accuracy.png", "confusion.png", "mistakes.png"} <= set(drawn), drawn

    config = Config(num_gpus=2, workdir=str(tmp_path / "local"), **settings)
    local, _ = train_manual(config, train_split, test_split, params=start)
    assert served_disagreement(tmp_path / "export" / "1", local, start,
                               test_split.images[:500]) < 1e-5


def test_sigterm_to_the_launcher_saves_on_the_chief_before_the_workers_stop(tmp_path, data_dir):
    train = [f"--data_dir={data_dir}", "--epochs=3", "--steps_per_epoch=100", "--eval_steps=1",
             "--batch_size=64"]
    run = launch(tmp_path, *train, popen=True)
    wait_for_first_backup(run, tmp_path)
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=240)
    assert run.returncode == 75, err[-3000:]
    assert "tfdp.launch: SIGTERM; asking the chief to save and stop" in err
    saved = re.search(r"^\[chief\] tfdp\.train: preempted \(SIGTERM\) at step (\d+): state of "
                      r"step \d+ saved in ", err, re.M)
    assert saved, err[-3000:]
    step = int(saved[1])
    assert Backups(str(tmp_path / "run"), 0, {}).steps()[-1] == step

    rerun = launch(tmp_path, *train)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    epoch, offset = divmod(step, 100)
    assert f"[chief] resuming at epoch {epoch + 1}/3, step {offset}/100 (global step {step})" \
        in rerun.stdout


def test_by_hand_a_server_and_a_client_refuse_what_cannot_work_in_one_line(tmp_path, data_dir):
    chief, worker = (f"127.0.0.1:{p}" for p in free_ports(2))
    cluster = {"chief": [chief], "worker": [worker]}

    def tf_config(kind, cluster=cluster):
        return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": 0}})}

    no_chief = run_module("tfdp.server", env=tf_config("worker", {"worker": [worker]}))
    assert no_chief.returncode == 1
    assert no_chief.stderr.strip().splitlines()[-1] == (
        "tfdp.server: error: TF_CONFIG names no chief: the chief is the client, the process "
        "running python -m tfdp.train")
    as_chief = run_module("tfdp.server", env=tf_config("chief"))
    assert as_chief.stderr.strip().splitlines()[-1] == (
        "tfdp.server: error: TF_CONFIG: task type 'chief' is not one tfdp.server runs (worker, ps)")
    # tfdp.train as a worker: tests/test_managed.py (refused before TensorFlow starts).

    def server():
        return subprocess.Popen([sys.executable, "-m", "tfdp.server", f"--data_dir={data_dir}"],
                                env=child_env(**tf_config("worker")), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=REPO)

    client = ["--epochs=1", "--steps_per_epoch=2", "--eval_steps=1",
              f"--workdir={tmp_path / 'run'}", f"--export_dir={tmp_path / 'export'}",
              "--collective_timeout=60"]
    # A server serves one client run, and stops once that client has gone.
    for flags, last_line in [
            (["--num_gpus=2", f"--data_dir={data_dir}"],
             f"tfdp.train: error: worker 0 ({worker}) serves 1 device(s), --num_gpus=2 asks for "
             "2 per worker: start its tfdp.server with --num_gpus=2"),
            ([f"--data_dir={tmp_path / 'nothing'}"],
             f"tfdp.train: error: worker 0 ({worker}) has not prepared --dataset=fashion_mnist "
             f"in {tmp_path / 'nothing'}"),
            ([f"--data_dir={data_dir}"], None)]:
        serving = server()
        try:
            done = run_module("tfdp.train", *flags, *client, env=tf_config("chief"), timeout=120)
            out, err = serving.communicate(timeout=30)
        finally:
            serving.kill()
        assert f"tfdp.server: worker 0 at {worker} serves " in out
        assert re.search(rf"^tfdp\.server: the chief at {chief} has finished; stopping$", out,
                         re.M), out + err
        assert serving.returncode == 0
        if last_line is None:
            assert done.returncode == 0, done.stderr[-3000:]
            assert "test acc (first 256 of 10000 test examples)" in done.stdout
        else:
            assert done.returncode == 1
            assert done.stderr.strip().splitlines()[-1].startswith(last_line), done.stderr
    assert done.stderr.count("tfdp.train: error") == 0

    # No server at all: the client gives up after --collective_timeout, naming the worker.
    lonely = run_module("tfdp.train", f"--data_dir={data_dir}", "--epochs=1",
                        f"--workdir={tmp_path / 'lonely'}", "--collective_timeout=5",
                        env=tf_config("chief"), timeout=120)
    assert lonely.returncode == 1
    assert lonely.stderr.strip().splitlines()[-1] == (
        "tfdp.train: error: the cluster did not start within --collective_timeout=5 s: never "
        f"answered: worker 0 ({worker}); start a tfdp.server for every worker of TF_CONFIG "
        "(python -m tfdp.launch does)")


root = pytest.mark.root("emulated hosts: network namespaces")


@root
def test_on_emulated_hosts_the_images_never_pass_through_the_client(tmp_path, data_dir):
    steps, batch = 20, 1536
    launcher, readmes = readme.launch_args("manual --hosts")  # The README's launch, and more.
    assert "--num_workers=3" in launcher and "--link=100mbit" in launcher, launcher
    run = launch(tmp_path, *readmes, f"--data_dir={data_dir}", "--num_gpus=2", "--epochs=1",
                 f"--steps_per_epoch={steps}", f"--batch_size={batch}", "--eval_steps=1",
                 launcher=launcher)
    assert run.returncode == 0, run.stderr[-3000:]
    err = run.stderr
    assert "allreduce ring" in err, err[-3000:]
    assert re.search(r"^tfdp\.launch: host 0 \(tfdp-\d+-h0\) at 10\.\d+\.\d+\.1 runs chief "
                     r"\(tfdp\.train\), link 100mbit each way$", err, re.M), err
    assert re.search(r"^tfdp\.launch: host 3 \(tfdp-\d+-h3\) at 10\.\d+\.\d+\.4 runs worker 2 "
                     r"\(tfdp\.server\), link 100mbit each way$", err, re.M), err
    assert "6 remote device(s)" in err  # --num_gpus=2 on each of 3 workers.
    moved = {int(m[1]): (float(m[2]) * 1e6, float(m[3]) * 1e6) for m in re.finditer(
        r"^tfdp\.launch: host (\d) \([^)]+\) sent ([\d.]+) MB, received ([\d.]+) MB$", err,
        re.M)}
    assert set(moved) == {0, 1, 2, 3}, err
    # The devices read 24 MB of pixels (20 steps of 1,536 images). What the client sends does
    # not grow with them: the starting parameters for 6 replicas (3.1 MB), the compiled steps,
    # 6 KB of indices a step, and a look for a worker's SIGTERM every second (6.35 MB in all
    # here; 4.06 MB with 4 replicas, 3.98 without the looks).
    pixels = steps * batch * 28 * 28
    assert moved[0][0] < pixels / 3, (moved, pixels)
    # The workers' ring moves the gradients (LeNet's: 0.52 MB) between them, not through the
    # client.
    assert min(moved[w][0] for w in (1, 2, 3)) > moved[0][1], moved
    assert not left_behind()
