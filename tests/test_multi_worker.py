"""Two real worker processes on 127.0.0.1 via the launcher: they train the same model as the
manual path, end with identical weights, export once, survive a killed worker by resuming, and
still need the Keras workaround."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import readme
from conftest import REPO
from exports import runtimes_agree, serve_in_clients
from traces import lanes_by_step
from same_model import serve_alike
from processes import child_env, launch as launch_cluster
from tfdp.config.settings import Config
from tfdp.paths.keras import workarounds
from tfdp.training import report


def launch(tmp_path, *train_args, **how):
    return launch_cluster(tmp_path, "multi_worker", *train_args, **how)


@pytest.mark.cluster
def test_two_workers_agree_with_each_other_and_the_manual_path(tmp_path, data_dir, test_split):
    """Float64, so the comparison is exact on any CPU; an odd batch, so the micro-batches of the
    accumulated updates are uneven (48 + 47); a model with kernel, bias and activity
    regularizers and an ``add_loss`` (tests/own_models/zoo.py), its losses counted once an
    update: the two workers' export serves the logits of the from-scratch path's model."""
    from tfdp.training import entry

    model = os.path.join(REPO, "tests", "own_models", "zoo.py") + ":regularized_cnn"
    settings = dict(model=model, batch_size=95, lr=0.05, epochs=1, steps_per_epoch=10,
                    eval_steps=2, seed=5, data_dir=data_dir, precision="float64",
                    accumulate_steps=2)
    launcher, readmes = readme.launch_args("multi_worker")  # The README's launch, and more.
    result = launch(tmp_path, *readmes, "--trace_steps=3:4",
                    "--export_formats=saved_model,onnx,litert", "--plots",
                    *[f"--{k}={v}" for k, v in settings.items()], launcher=launcher)
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout.splitlines()
    # Each worker traced itself; the chief merged both on one clock.
    found = lanes_by_step(json.loads((tmp_path / "run" / "timeline.json").read_text()))
    for worker in ("worker 0", "worker 1"):
        for step in (3, 4):
            assert {"forward", "backward"} <= found[(worker, "replica 0", step)], found.keys()
    assert sum(l.startswith("[0] epoch 1/1: loss") for l in out) == 1
    assert not any(l.startswith("[1] epoch") or l.startswith("[1] test acc") for l in out)
    assert any(l.startswith("[0] test acc (first 190 of 10000 test examples):") for l in out)
    assert "MultiWorkerMirroredStrategy, 2 replica(s) in sync on 2 workers" in result.stderr
    assert ("global batch 190 = 95 + 95 per replica, accumulated from 2 micro-batches of 95 "
            "(steps below are updates)") in result.stderr
    assert "; lr 0.05; float64;" in result.stderr
    # The workers print tfdp's lines, not TF's start-up banners or saver INFO.
    assert not re.search(r"^\[\d\] ([IE]\d{4} |WARNING: All log)", result.stderr, re.M), \
        result.stderr[-3000:]
    assert os.listdir(tmp_path / "export") == ["1"]  # Exported once, by the chief.
    drawn = sorted(p.name for p in (tmp_path / "run").glob("*.png"))  # By the chief (--plots).
    assert {"accuracy.png", "confusion.png", "mistakes.png"} <= set(drawn), drawn
    # Each worker's replica stamped its steps; the chief's record holds both, read at steps
    # 5 and 10 (the callback's checks).
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["worker_precisions"] == ["float64", "float64"]  # What each worker computed in.
    record = metrics["epochs"][0]
    assert record["replicas"] == ["worker 0 (replica 0)", "worker 1 (replica 1)"]
    assert all(ms > 0 for ms in record["replica_compute_ms"]), record
    assert min(record["replica_wait_ms"]) >= 0

    finals = [l for l in result.stderr.splitlines() if "final weights sha256" in l]
    digest_of = {l.split("(worker ")[1].rstrip(")"): l.split("sha256 ")[1].split()[0]
                 for l in finals}
    assert set(digest_of) == {"0", "1"} and digest_of["0"] == digest_of["1"], finals

    manual = entry.train(Config(num_gpus=2, workdir=str(tmp_path / "manual"),
                                export_dir=str(tmp_path / "manual-export"), **settings))
    serve_alike(tmp_path / "export" / "1", manual.export_path, test_split.images[:500])
    # ONNX and LiteRT from its float32 twin: the float64 model's logits to float32's rounding.
    runtimes_agree(serve_in_clients(tmp_path / "export" / "1", test_split.images[:200],
                                    test_split.labels[:200], tmp_path), 200)


@pytest.mark.cluster
def test_a_worker_with_an_empty_shard_adds_nothing(tmp_path, data_dir):
    # 10,000 test examples in batches of 3,333: the last batch holds 1 example, split 1 + 0.
    result = launch(tmp_path, "--batch_size=3333", "--epochs=1", "--steps_per_epoch=1",
                    f"--data_dir={data_dir}")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "global batch 3333 = 1667 + 1666 per replica" in result.stderr
    record = report.load_history(str(tmp_path / "run"), 1)[0]
    assert 0 < record["test_acc"] < 1 and np.isfinite(record["loss"])


@pytest.mark.cluster
def test_keras_still_needs_the_multi_worker_workaround(tmp_path, data_dir):
    result = launch(tmp_path, "--epochs=1", "--steps_per_epoch=2", "--eval_steps=1",
                    f"--data_dir={data_dir}", env={workarounds.DISABLE_ENV: "1"})
    if result.returncode == 0:
        pytest.fail("Keras fit now works under MultiWorkerMirroredStrategy without "
                    "tfdp/paths/keras/workarounds.py: remove the workaround, its apply() call "
                    "in paths/keras/trainer.py, and this test")
    assert ("PerReplica" in result.stderr or "Invalid reduction dimension" in result.stderr), \
        result.stderr[-3000:]


_PER_REPLICA_CHECK = """
import tensorflow as tf
from tfdp.paths.keras import distributed_input
strategy = tf.distribute.MultiWorkerMirroredStrategy()  # One local worker: no TF_CONFIG.
fn = lambda context: tf.data.Dataset.range(8).batch(2).repeat()
options = tf.distribute.InputOptions(
    experimental_fetch_to_device=False,
    experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA)
try:
    strategy.distribute_datasets_from_function(fn, options)
    print("PUBLIC PER_REPLICA WORKS")
except NotImplementedError:
    print("PUBLIC PER_REPLICA REFUSED")
batches = tf.data.Dataset.from_tensor_slices(
    (tf.zeros([8, 28, 28, 1], tf.uint8), tf.zeros([8], tf.int64))).batch(2)
worker_iterator = iter(distributed_input.distribute(strategy, batches, 1))._iterators[0]
print("MULTI DEVICE ITERATOR" if "MultiDevice" in type(worker_iterator._iterator).__name__
      else "OWN ITERATOR")
"""


def test_per_replica_input_under_mwms_is_still_ours_to_build():
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = subprocess.run([sys.executable, "-c", _PER_REPLICA_CHECK], capture_output=True,
                            text=True, timeout=120, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    if "PUBLIC PER_REPLICA WORKS" in result.stdout:
        pytest.fail("MultiWorkerMirroredStrategy now accepts PER_REPLICA input: replace "
                    "tfdp/paths/keras/distributed_input._multi_worker with the public "
                    "distribute_datasets_from_function")
    assert "PUBLIC PER_REPLICA REFUSED" in result.stdout, result.stdout
    # Our input really gives the replica its own iterator, not a MultiDeviceIterator.
    assert "OWN ITERATOR" in result.stdout, result.stdout + result.stderr[-2000:]


@pytest.mark.parametrize("train_args, strategy", [
    (["--strategy=mirrored"], "mirrored"), (["--strategy", "plain"], "plain")])
def test_the_launcher_refuses_strategies_that_train_in_one_process(capsys, train_args, strategy):
    from tfdp import launch as launcher

    assert launcher.launch(2, train_args) == 2  # Refused before any process starts.
    assert capsys.readouterr().err == (
        "tfdp.launch: error: the launcher starts --strategy=manual, multi_worker or "
        f"parameter_server clusters; --strategy={strategy} trains in one process: run python "
        "-m tfdp.train instead\n")


def test_the_launcher_parses_the_workers_flags_once_as_tfdp_train_does(capsys):
    """The launcher reads the workers' command line into the ``Config`` they will run (as absl
    reads it: ``--strategy manual``, ``--noverbose``), starts the servers with the flags they
    share with it, and refuses what tfdp.train would refuse before any process starts."""
    from tfdp import launch as launcher
    from tfdp.config.flags import server_args
    from tfdp.launcher.local_cluster import workers_config

    config, problem = workers_config(["--strategy", "manual", "--noverbose", "--num_gpus=2",
                                      "--dataset=mnist", "--help"])
    assert (problem, config.strategy, config.num_gpus, config.verbose) == ("", "manual", 2, False)
    assert server_args(config) == ["--num_gpus=2", "--dataset=mnist"]
    assert launcher.launch(2, ["--strategy=multi_worker", "--lr=-1"]) == 2
    assert capsys.readouterr().err == (
        "tfdp.launch: error: --lr must be a positive finite number, got -1.0\n")


@pytest.mark.cluster
def test_workers_whose_machines_decide_auto_differently_refuse_in_one_line(tmp_path, data_dir):
    """Two workers started by hand, each on "its own machine": a bfloat16 speed cached as 2x
    float32's for one and 0.5x for the other, so ``--precision=auto`` resolves to bfloat16 on
    worker 0 and float32 on worker 1. One synchronous model computed in two precisions would
    train while the run reported one: both stop at once, naming each worker's."""
    import socket

    from tfdp.util import devices

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    key = __import__("hashlib").sha1(devices._machine().encode()).hexdigest()[:12]
    workers = []
    for index, ratio in enumerate([2.0, 0.5]):
        cache = tmp_path / f"cache-{index}"
        (cache / "tfdp").mkdir(parents=True)
        (cache / "tfdp" / f"bfloat16-speed-{key}.json").write_text(
            json.dumps({"machine": devices._machine(), "ratio": ratio}))
        tf_config = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                "task": {"type": "worker", "index": index}})
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "tfdp.train", "--strategy=multi_worker", "--precision=auto",
             f"--data_dir={data_dir}", f"--workdir={tmp_path / 'run'}", "--epochs=1",
             "--steps_per_epoch=2", "--eval_steps=1", "--collective_timeout=60",
             f"--export_dir={tmp_path / 'export'}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
            env=dict(child_env(), TF_CONFIG=tf_config, XDG_CACHE_HOME=str(cache))))
    for worker in workers:
        out, err = worker.communicate(timeout=180)
        assert worker.returncode == 1, err[-3000:]
        assert err.strip().splitlines()[-1] == (
            "tfdp.train: error: the workers would compute in different precisions (worker 0: "
            "bfloat16, worker 1: float32; --precision=auto decides by each worker's machine): "
            "give every worker the same --precision"), err[-3000:]
        assert "epoch 1/1" not in out
    assert not (tmp_path / "export").exists() or not os.listdir(tmp_path / "export")
