"""--strategy=parameter_server: a coordinator, tfdp.server workers and parameter servers, real
processes on loopback started by tfdp.launch."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import readme
from conftest import REPO
from exports import runtimes_agree, serve_in_clients
from same_model import serve_alike
from processes import (child_env, run_module, task_pid, wait_for_first_backup)
from traces import lanes_by_step
from processes import launch as launch_cluster
from tfdp.config.settings import Config
from tfdp.launcher.processes import free_ports
from tfdp.data import pipeline
from tfdp.paths.parameter_server.pace import WorkerPace
from tfdp.training import entry

def launch(tmp_path, *train_args, workers=2, ps=1, on_hosts=False, **how):
    return launch_cluster(tmp_path, "parameter_server", *train_args, launcher=(
        f"--num_workers={workers}", f"--num_ps={ps}", *(["--hosts"] if on_hosts else [])), **how)


@pytest.mark.cluster
def test_two_workers_and_two_sharded_servers_train_report_and_export(tmp_path, data_dir):
    launcher, readmes = readme.launch_args("parameter_server")  # The README's launch, and more.
    assert "--num_ps=2" in launcher and "--ps_shards=2" in readmes, (launcher, readmes)
    result = launch_cluster(tmp_path, "parameter_server", *readmes, f"--data_dir={data_dir}",
                            "--epochs=2", "--steps_per_epoch=8", "--eval_steps=2",
                            "--trace_steps=3:4", "--export_formats=saved_model,onnx,litert",
                            "--plots", launcher=launcher)
    assert result.returncode == 0, result.stderr[-4000:]
    # The coordinator traces itself and captures the servers: each traced step ran on one
    # worker (forward, backward), and updated its halves of W3 on both parameter servers.
    trace = json.loads((tmp_path / "run" / "timeline.json").read_text())
    found = lanes_by_step(trace)
    process = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
               if e["name"] == "process_name"}
    for step in (3, 4):
        assert any({"forward", "backward"} <= found.get((f"worker {w}", "replica 0", step), set())
                   for w in (0, 1)), (step, found)
        for ps in ("ps 0", "ps 1"):
            assert "W3" in {e["args"].get("parameter") for e in trace["traceEvents"]
                            if e.get("cat") == "update" and e["args"].get("step") == step
                            and process[e["pid"]] == ps}, (step, ps)
    assert {k[0] for k in found} == {"chief", "worker 0", "worker 1", "ps 0", "ps 1"}
    out, err = result.stdout, result.stderr
    assert "2 tfdp.server workers at 127.0.0.1:" in err
    assert "2 parameter server(s) at 127.0.0.1:" in err
    # W3 (800 x 128 floats, 409.6 KB) is split in two halves, one on each server.
    placed = re.search(r"^\[chief\] parameters: (.*)$", err, re.M)
    assert placed, err[-3000:]
    assert "ps 0 holds" in placed[1] and "ps 1 holds" in placed[1]
    halves = re.findall(r"W3\[[12]/2\] \(204\.8 KB\)", placed[1])
    assert len(halves) == 2, placed[1]
    epochs = [line for line in out.splitlines() if line.startswith("[chief] epoch ")]
    staleness = r"staleness mean \d+\.\d\d max \d+(; straggler: .*)?$"
    assert len(epochs) == 2 and all(re.search(staleness, e) for e in epochs), out
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    for record in metrics["epochs"]:
        # Two workers, at most four steps in flight: a step is at most 3 updates behind.
        assert 0 <= record["staleness_mean"] <= record["staleness_max"] <= 3
        assert record["test_acc"] > 0
    assert "[chief] test acc (first 512 of 10000 test examples):" in out
    # The chief draws the charts (--plots) from what the workers trained.
    drawn = sorted(p.name for p in (tmp_path / "run").glob("*.png"))
    assert {"accuracy.png", "confusion.png", "mistakes.png"} <= set(drawn), drawn
    assert not re.search(r"^\[[\w ]+\] ([IWE]\d{4} |Traceback)", err, re.M), err[-3000:]
    assert os.listdir(tmp_path / "export") == ["1"]
    test = pipeline.load_split("test", data_dir)
    runtimes_agree(serve_in_clients(tmp_path / "export" / "1", test.images[:200],
                                    test.labels[:200], tmp_path), 200)


@pytest.mark.cluster
def test_resnet18_trains_on_balanced_servers_and_exports(tmp_path, data_dir):
    result = launch(tmp_path, f"--data_dir={data_dir}", "--model=resnet18", "--batch_size=16",
                    "--epochs=1", "--steps_per_epoch=2", "--eval_steps=1", workers=1, ps=2)
    assert result.returncode == 0, result.stderr[-4000:]
    held = [float(kb) for kb in re.findall(r"= ([\d.]+) KB", re.search(
        r"^\[chief\] parameters: (.*)$", result.stderr, re.M)[1])]
    # ResNet-18's 44.7 MB spread by size, largest first: round robin would put every kernel
    # (all but 50 KB) on one server.
    assert len(held) == 2 and 44e3 < sum(held) < 46e3 and min(held) > 0.45 * sum(held), held
    served = tf.saved_model.load(str(tmp_path / "export" / "1")).signatures["serving_default"](
        images=tf.zeros([2, 28, 28, 1], tf.uint8))
    assert served["logits"].dtype == tf.float32 and served["logits"].shape == (2, 10)


@pytest.mark.cluster
def test_one_worker_trains_your_model_exactly_as_from_scratch(tmp_path, data_dir):
    """A Keras model of your own with Dropout (its seed state on a server, moved by each step),
    batch normalization (its statistics live, and move, on the server too) and regularizers,
    ``add_loss`` among them (counted once a step), float64: one worker runs its steps in order,
    never stale, and its export serves the logits of the from-scratch path's model on one
    device."""
    model = os.path.join(os.path.dirname(__file__), "own_models",
                         "zoo.py") + ":regularized_dropout_norm_cnn"
    settings = dict(model=model, batch_size=60, lr=0.05, epochs=2, steps_per_epoch=3,
                    eval_steps=1, seed=5, data_dir=data_dir, precision="float64")
    result = launch(tmp_path, *[f"--{k}={v}" for k, v in settings.items()], workers=1)
    assert result.returncode == 0, result.stderr[-4000:]
    held = re.search(r"^\[chief\] parameters: (.*)$", result.stderr, re.M)[1]
    assert "moving_mean" in held and "moving_variance" in held, held
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [r["staleness_max"] for r in metrics["epochs"]] == [0, 0]
    local = entry.train(Config(num_gpus=1, workdir=str(tmp_path / "local"),
                               export_dir=str(tmp_path / "local-export"), **settings))
    serve_alike(tmp_path / "export" / "1", local.export_path,
                pipeline.load_split("test", data_dir).images[:200])


@pytest.mark.cluster
def test_killed_workers_are_started_again_and_the_run_finishes_whatever_the_chief_was_doing(
        tmp_path, data_dir):
    """Three kills in one run, at three moments: just after an epoch's backup (steps in flight),
    and 0.4 s and 0.9 s after one (with 6 steps an epoch and the whole test set to evaluate,
    the chief is evaluating then, or reading the parameters for the backup). A worker's death
    never ends the run, whatever the chief waits on; each is started again."""
    train = [f"--data_dir={data_dir}", "--epochs=5", "--steps_per_epoch=6", "--eval_steps=40"]
    run = launch(tmp_path, *train, popen=True)
    for epoch, (worker, delay) in enumerate([(1, 0.0), (0, 0.4), (1, 0.9)], start=1):
        wait_for_first_backup(run, tmp_path, step=6 * epoch)
        time.sleep(delay)
        os.kill(task_pid(run.pid, "worker", worker), signal.SIGKILL)
    out, err = run.communicate(timeout=400)
    assert run.returncode == 0, err[-4000:]
    restarts = re.findall(r"^tfdp\.launch: worker (\d) exited with -9 while the chief runs; "
                          r"starting it again \((\d)/3\)", err, re.M)
    assert restarts == [("1", "1"), ("0", "1"), ("1", "2")], err[-3000:]
    assert "lost contact" not in err and "Traceback" not in err, err[-3000:]
    assert sum(line.startswith("[chief] epoch ") for line in out.splitlines()) == 5
    assert os.listdir(tmp_path / "export") == ["1"]
    # Steps the killed workers had pushed and were run again counted once.
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["updates_applied"] == 30


def test_a_step_run_again_pushes_only_what_had_not_landed():
    """The training step on a cluster in one process (a worker, two servers), driven step by
    step: run twice with the same number (its worker lost after pushing), the second moves no
    variable and the counter counts it once, never stale; run after its push had reached only
    half the variables, it moves the other half; the next step, and a step one mark window
    later (its slot reused), move them all. Each variable's marks live on its own server."""
    child = subprocess.run([sys.executable, os.path.join(REPO, "tests", "ps_step_once.py")],
                           capture_output=True, text=True, timeout=300, env=child_env())
    assert child.returncode == 0, child.stderr[-3000:]
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert len(found["servers"]) == 2 and all(found["marks beside"]), found
    count = len(found["first"]["moved"])
    assert found["first"] == {"moved": [True] * count, "updates": 1, "staleness": 0}
    assert found["again"] == {"moved": [False] * count, "updates": 1, "staleness": 0}
    assert found["partly pushed"] == {"moved": [i % 2 == 1 for i in range(count)],
                                      "updates": 2, "staleness": 0}
    assert found["next"] == {"moved": [True] * count, "updates": 3, "staleness": 0}
    assert found["a step MARKS later"] == {"moved": [True] * count, "updates": 4,
                                           "staleness": 0}


def test_a_workers_pace_names_a_straggler_only_when_it_is_clearly_slower(tmp_path):
    pace = WorkerPace(3, str(tmp_path))
    for step, worker, ms in [(1, 0, 10), (2, 1, 11), (3, 2, 40), (4, 0, 12), (5, 1, 9)]:
        pace.add(step, worker, 100.0, 100.0 + ms / 1e3)
    figures, note = pace.epoch_figures()
    assert figures["worker_steps"] == [2, 2, 1]
    assert figures["worker_step_ms"] == pytest.approx([11, 10, 40], abs=1e-3)
    assert note == ("; straggler: worker 2 takes 40.0 ms a step, 3.8x the others' 10.5 ms; it "
                    "ran 20% of the steps")
    for step, worker, ms in [(6, 0, 10), (7, 1, 13), (8, 2, 14)]:  # Within 1.5x: no one named.
        pace.add(step, worker, 100.0, 100.0 + ms / 1e3)
    assert pace.epoch_figures()[1] == ""
    # One step slowed by another process on the machine (CI's failure): no one named.
    for step, worker, ms in [(9, 0, 140), (10, 1, 141), (11, 0, 142), (12, 1, 400), (13, 1, 139)]:
        pace.add(step, worker, 100.0, 100.0 + ms / 1e3)
    assert pace.epoch_figures()[1] == ""
    pace.add(14, 0, 100.0, 100.2)  # One worker ran the epoch: no one to compare with.
    figures, note = pace.epoch_figures()
    assert figures["worker_step_ms"] == [200.0, None, None] and note == ""
    record = json.loads(open(pace.dump("a test")).read())
    assert [(s["step"], s["worker"]) for s in record["steps"]][-2:] == [(13, "worker 1"),
                                                                       (14, "worker 0")]


def test_the_launcher_refuses_parameter_servers_for_another_strategy(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tfdp.launch", "--num_ps=1", "--",
                             "--strategy=manual", f"--workdir={tmp_path / 'run'}"],
                            capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "tfdp.launch: error: --num_ps starts parameter servers for --strategy=parameter_server, "
        "not --strategy=manual")


@pytest.mark.parametrize("flags, message", [
    (["--ps_shards=3"], "--ps_shards=3 is more than the 2 parameter server(s) of TF_CONFIG: a "
                        "shard per server at most"),
    (["--model=resnet18", "--ps_shards=2"], "--ps_shards=2 splits the from-scratch lenet's "
                                            "parameters; --model=resnet18's Keras layers read "
                                            "whole variables")])
def test_bad_flags_are_one_line_errors_before_the_cluster_is_reached(tmp_path, flags, message):
    # Nothing listens at these addresses (free ports any user may take): the refusals come
    # before any peer is reached.
    chief, worker, *servers = (f"127.0.0.1:{port}" for port in free_ports(4))
    cluster = {"chief": [chief], "worker": [worker], "ps": servers}
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    result = run_module("tfdp.train", "--strategy=parameter_server", *flags,
                        f"--workdir={tmp_path / 'run'}", env={"TF_CONFIG": tf_config},
                        timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"tfdp.train: error: {message}"), \
        result.stderr[-2000:]


def test_without_a_cluster_or_with_ps_shards_elsewhere_tfdp_train_refuses(tmp_path):
    alone = run_module("tfdp.train", "--strategy=parameter_server",
                       f"--workdir={tmp_path / 'run'}", env={"TF_CONFIG": ""})
    assert alone.returncode == 1
    assert alone.stderr.strip().splitlines()[-1].startswith(
        "tfdp.train: error: --strategy=parameter_server needs a cluster: TF_CONFIG with a chief")
    shards = run_module("tfdp.train", "--ps_shards=2", f"--workdir={tmp_path / 'run'}")
    assert shards.stderr.strip().splitlines()[-1] == (
        "tfdp.train: error: --ps_shards=2 is --strategy=parameter_server's (its parameters split "
        "across servers): --strategy=manual keeps no parameter servers")


class _Remote:
    """A step's result on a fake cluster: a value, or an error raised by ``fetch``."""

    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def fetch(self):
        if self.error:
            raise self.error
        return self.value


class _Coordinator:
    """Raises ``pending`` once from the next ``schedule`` or ``done`` (as TensorFlow's
    coordinator raises a closure's failure once); schedules succeed after that."""

    def __init__(self, pending=None):
        self.pending, self.scheduled = pending, []

    def schedule(self, fn, args):
        self.done()
        self.scheduled.append(args[1])
        return _Remote(value=(np.float32(0.5), np.int32(3), np.int64(0), np.int64(0),
                              np.array([1.0, 1.01])))

    def done(self):
        error, self.pending = self.pending, None
        if error:
            raise error


def test_a_worker_failure_reaching_the_chief_reschedules_the_lost_steps_only():
    """The race of the issue, made deterministic: a step's result raises a worker's failure
    ([Op:Identity], connection reset: what TensorFlow 2.21 raised in the chief in 1 run of 10
    with a worker killed), with steps in flight finished or cancelled. The finished keep their
    results, the lost are scheduled again; a parameter server's failure still ends the run."""
    from tfdp.paths.parameter_server import trainer

    worker = tf.errors.UnavailableError(None, None, "recvmsg:Connection reset by peer\n"
                                        "Additional GRPC error information from remote target "
                                        "/job:worker/replica:0/task:1/device:CPU:0 [Op:Identity]")
    cancelled = tf.errors.CancelledError(None, None, "RecvFromRemoteAsync is cancelled.")
    steps = trainer.ScheduledSteps.__new__(trainer.ScheduledSteps)
    steps.coordinator, steps.staleness, steps.train_step = _Coordinator(worker), [], None
    steps.arrays, steps.pace = {"train": None}, WorkerPace(2, "")
    first, finished, lost = (trainer._Step(i, np.zeros([n]), 0.1)
                             for i, n in ((1, 2), (2, 3), (3, 4)))
    first.remote = _Remote(error=worker)
    finished.remote = _Remote(value=(1.0, 7, 0, 1, np.array([1.0, 1.02])))
    lost.remote = _Remote(error=cancelled)
    steps.in_flight = [first, finished, lost]
    assert steps.collect(first) == [(0.5, 3, 2)]  # (loss, correct, examples) of the one step.
    assert [len(batch) for batch in steps.coordinator.scheduled] == [2, 4]
    assert steps.collect(finished) == [(1.0, 7, 3)] and steps.collect(lost) == [(0.5, 3, 4)]
    assert [(step, worker) for step, worker, _, _ in steps.pace.kept] == [(1, 0), (2, 1), (3, 0)]

    ps = tf.errors.UnavailableError(None, None, "Socket closed\nGRPC error information from "
                                    "remote target /job:ps/replica:0/task:0")
    step = trainer._Step(4, np.zeros([5]), 0.1)
    step.remote = _Remote(error=ps)
    steps.in_flight = [step]
    with pytest.raises(tf.errors.UnavailableError, match="/job:ps"):
        steps.collect(step)
