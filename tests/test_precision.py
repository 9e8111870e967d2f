"""``--precision=bfloat16`` (mixed precision) on every path, and ``--allreduce_dtype``: the runs
train and serve the same contract, the parameters stay float32, and bfloat16 agrees with float32
to bfloat16's rounding (speed is the bench's to measure, not the suite's)."""

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from conftest import DEVICES
from processes import run_module
from same_model import comparable_start, update_difference
import tfdp
from tfdp.config.settings import Config
from tfdp.models.stateless import HandWrittenLeNet
from tfdp.paths.manual.replicate import Replicas
from tfdp.paths.manual.step import StepSettings, make_train_step
from tfdp.util import devices
from tfdp.util.errors import UserError

# bfloat16 keeps 8 significant bits: rounding to it moves a value by up to 2^-9 of itself.
HALF_ULP = 2.0 ** -9


@pytest.mark.parametrize("strategy, num_gpus", [("manual", 2), ("mirrored", 2), ("plain", 1)])
def test_bfloat16_trains_keeps_float32_parameters_and_serves_float32(tmp_path, data_dir,
                                                                    strategy, num_gpus):
    result = tfdp.run(strategy=strategy, num_gpus=num_gpus, precision="bf16", epochs=1,
                      steps_per_epoch=8, eval_steps=1, init="glorot", data_dir=data_dir,
                      workdir=str(tmp_path / "run"), export_dir=str(tmp_path / "exp"))
    assert result.plan.precision == "bfloat16"
    assert all(w.dtype == np.float32 for w in result.weights)  # Parameters: float32.
    assert 0 <= result.test_accuracy <= 1 and np.isfinite(result.history[0]["loss"])
    serve = tf.saved_model.load(result.export_path).signatures["serving_default"]
    out = serve(images=tf.zeros([3, 28, 28, 1], tf.uint8))
    assert out["logits"].dtype == tf.float32 and out["probabilities"].dtype == tf.float32
    assert out["classes"].dtype == tf.int64
    np.testing.assert_allclose(out["probabilities"].numpy().sum(axis=1), 1, rtol=1e-5)


@pytest.mark.cluster
def test_bfloat16_under_multi_worker_trains_and_exports(tmp_path, data_dir):
    result = run_module("tfdp.launch", "--num_workers=2", "--", "--strategy=multi_worker",
                        "--precision=bf16", "--epochs=1", "--steps_per_epoch=4",
                        "--eval_steps=1", f"--data_dir={data_dir}",
                        f"--workdir={tmp_path / 'run'}", f"--export_dir={tmp_path / 'exp'}",
                        timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "; bfloat16; " in result.stderr
    assert os.listdir(tmp_path / "exp") == ["1"]


def _one_step(start, images, labels, compute=None, **dtypes):
    replicas = Replicas.place(start, DEVICES[:2], model=HandWrittenLeNet.of(start, compute))
    make_train_step(replicas, StepSettings(allreduce="ring", **dtypes))(images, labels,
                                                                        tf.constant(0.1))
    return {name: var.numpy() for name, var in replicas.params[0].items()}


def test_bfloat16_agrees_with_float32_to_its_rounding(train_split):
    images = tf.constant(train_split.images[:256])
    labels = tf.constant(train_split.labels[:256])
    start = comparable_start(3)
    exact = _one_step(start, images, labels)
    mixed = _one_step(start, images, labels, compute="bfloat16")
    assert all(v.dtype == np.float32 for v in mixed.values())
    # A gradient in bfloat16 passes through about 16 rounded operands (a weight and an
    # activation per layer, forward and backward, 4 layers), each off by up to HALF_ULP: to
    # first order 16 x 2^-9 = 3 % of the update, which sums over many terms may amplify a
    # little. Allow 4 times that; and more than float32's own rounding (~1e-6), or the step
    # did not compute in bfloat16 at all.
    assert 1e-3 < update_difference(mixed, exact, start) < 4 * 16 * HALF_ULP
    # Summing in bfloat16 rounds each of the 2 gradients and the sum once: 3 x 2^-9 at most
    # per element, before cancellation.
    summed = _one_step(start, images, labels, allreduce_dtype="bfloat16")
    assert 1e-5 < update_difference(summed, exact, start) < 2 * 3 * HALF_ULP


@pytest.mark.parametrize("kwargs, message", [
    (dict(precision="fp16"), "--precision=fp16 is not one of: float32, float64, bfloat16"),
    (dict(allreduce_dtype="fp16"), "--allreduce_dtype=fp16 is not one of: float32, bfloat16"),
    (dict(strategy="mirrored", allreduce_dtype="bf16"),
     "--allreduce_dtype=bfloat16 is --strategy=manual's (the dtype of its own allreduce): "
     "--strategy=mirrored sums in float32"),
    (dict(precision="float64", allreduce_dtype="bf16"),
     "--allreduce_dtype=bfloat16 with --precision=float64 would round the gradients the "
     "float64 run exists to keep exact")])
def test_bad_precision_flags_are_one_line_errors(kwargs, message):
    with pytest.raises(UserError, match=re.escape(message)):
        Config(**kwargs)


def test_short_names_are_accepted():
    config = Config(precision="bf16", allreduce_dtype="bf16")
    assert (config.precision, config.allreduce_dtype, config.variable_dtype) == (
        "bfloat16", "bfloat16", "float32")
    assert Config(precision="fp32").precision == "float32"


def measured_by_a_stand_in(monkeypatch) -> list:
    """bfloat16's speed "measured" from now on by a stand-in returning 1.25 (a real measurement
    is a TensorFlow process of its own, 6 CPU-seconds here: the test of the cache measures once
    for real, and the rest need a figure, not the machine's): the list of its calls."""
    calls = []
    monkeypatch.setattr(devices, "_bfloat16_ratio_in_a_child",
                        lambda: calls.append(len(calls)) or 1.25)
    return calls


@pytest.fixture
def stand_in(monkeypatch):
    return measured_by_a_stand_in(monkeypatch)


@pytest.mark.slow
def test_bfloat16_speed_is_measured_once_per_machine_and_a_damaged_cache_measured_again(
        tmp_path, caplog, monkeypatch):
    speed = devices.bfloat16_speed(str(tmp_path))  # Measured for real, in a child process.
    # A ratio, not a speed target: AMX's bfloat16 tiles beside float32's vector units, under the
    # suite's load, measured more than 20x; a broken measurement gives 0, inf or nan.
    assert 0.05 < speed < 100
    cache, = tmp_path.glob("bfloat16-speed-*.json")
    kept = json.loads(cache.read_text())
    calls = measured_by_a_stand_in(monkeypatch)  # Whether it measures again, from here.
    cache.write_text(json.dumps(dict(kept, ratio=0.54)))  # Another machine's figure, this key.
    assert devices.bfloat16_speed(str(tmp_path)) == 0.54 and not calls  # Read, not measured.
    cache.write_text(json.dumps(dict(kept, machine="another machine", ratio=0.54)))
    assert devices.bfloat16_speed(str(tmp_path)) == 1.25 and calls == [0]  # Another's: measured.
    cache.write_text('{"machine": ')  # Damaged.
    assert devices.bfloat16_speed(str(tmp_path)) == 1.25 and calls == [0, 1]
    assert "measuring bfloat16's speed again" in caplog.text
    assert json.loads(cache.read_text()) == dict(kept, ratio=1.25)


def test_a_worker_narrowed_to_fewer_cores_keeps_its_own_figure(tmp_path, monkeypatch, stand_in):
    """tfdp.launch narrows each local worker to its share of the cores, which the figure
    depends on: measured there, it must not replace the whole machine's (which every later
    run would then measure again, under whatever load that moment has)."""
    whole = devices.bfloat16_speed(str(tmp_path))
    with monkeypatch.context() as narrowed:
        narrowed.setattr(devices, "available_cores", lambda: 1)
        devices.bfloat16_speed(str(tmp_path))
    assert len(list(tmp_path.glob("bfloat16-speed-*.json"))) == 2 and stand_in == [0, 1]
    assert devices.bfloat16_speed(str(tmp_path)) == whole and stand_in == [0, 1]  # Kept.


def test_a_machine_slower_in_bfloat16_is_warned_with_its_measured_ratio(tmp_path, data_dir,
                                                                       stand_in):
    """The cache says 0.54 for this machine (an Intel Xeon's avx512_bf16 without AMX): a bf16
    run warns with that figure, and trains."""
    devices.bfloat16_speed(str(tmp_path / "tfdp"))  # The cache file, this machine's key.
    cache, = (tmp_path / "tfdp").glob("bfloat16-speed-*.json")
    cache.write_text(json.dumps(dict(json.loads(cache.read_text()), ratio=0.54)))
    result = run_module("tfdp.train", "--precision=bf16", "--epochs=1", "--steps_per_epoch=2",
                        "--eval_steps=1", f"--data_dir={data_dir}",
                        f"--workdir={tmp_path / 'run'}", f"--export_dir={tmp_path / 'export'}",
                        env={"XDG_CACHE_HOME": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("warning: this machine multiplies matrices in bfloat16 at 0.54x float32's speed "
            "(measured once, cached): bfloat16 will be slower than float32 here, not wrong"
            in result.stderr), result.stderr[-2000:]


@pytest.mark.parametrize("ratio, chosen", [(0.54, "float32"), (1.8, "bfloat16")])
def test_auto_precision_is_bfloat16_only_where_the_machine_measured_it_faster(
        tmp_path, data_dir, monkeypatch, capsys, stand_in, ratio, chosen):
    """The fast recipe's ``--precision=auto``: this machine's cached bfloat16 speed says 0.54x
    (an Intel Xeon's avx512_bf16 without AMX) or 1.8x (an AMD EPYC's); the run computes in what
    pays, says why, and records what it used."""
    devices.bfloat16_speed(str(tmp_path / "tfdp"))  # The cache file, this machine's key.
    cache, = (tmp_path / "tfdp").glob("bfloat16-speed-*.json")
    cache.write_text(json.dumps(dict(json.loads(cache.read_text()), ratio=ratio)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert Config(recipe="fast").precision == "auto" and Config().precision == "float32"
    result = tfdp.run(recipe="fast", num_gpus=1, epochs=1, steps_per_epoch=2, eval_steps=1,
                      data_dir=data_dir, workdir=str(tmp_path / "run"),
                      export_dir=str(tmp_path / "exp"))
    assert result.plan.precision == chosen
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["precision"] == chosen
    assert (f"--precision=auto: {chosen} (this machine multiplies matrices in bfloat16 at "
            f"{ratio:.2f}x float32's speed" in capsys.readouterr().err)


@pytest.mark.slow
def test_auto_precision_measured_for_the_first_time_leaves_the_devices_to_the_run(tmp_path,
                                                                                   data_dir):
    """No figure cached yet: measuring bfloat16's speed (in a child process) must not start
    TensorFlow in the run's process before it makes its 2 devices."""
    result = run_module("tfdp.train", "--recipe=fast", "--num_gpus=2", "--epochs=1",
                        "--steps_per_epoch=2", "--eval_steps=1", f"--data_dir={data_dir}",
                        f"--workdir={tmp_path / 'run'}", f"--export_dir={tmp_path / 'export'}",
                        env={"XDG_CACHE_HOME": str(tmp_path / "empty"),
                             "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"--precision=auto: (float32|bfloat16) \(this machine multiplies",
                     result.stderr), result.stderr[-2000:]
    assert "2 device(s)" in result.stderr + result.stdout
    assert list((tmp_path / "empty" / "tfdp").glob("bfloat16-speed-*.json"))


def test_the_matmul_ceiling_takes_the_best_of_ten_or_of_three_past_its_time(monkeypatch):
    """A dtype without units of its own (bf16 on most CPUs) runs a 2048 x 2048 matmul in about
    0.3 s: ten of them were 7 CPU-seconds of every bench. Past ``seconds`` it stops at three."""
    calls = []
    matmul = tf.linalg.matmul
    monkeypatch.setattr(tf.linalg, "matmul", lambda a, b: calls.append(1) or matmul(a, b))
    assert devices.matmul_gflops("float32", n=64, seconds=1e9) > 0
    assert len(calls) == 1 + 10  # The warm-up, then the timed ones.
    calls.clear()
    assert devices.matmul_gflops("float32", n=64, seconds=0) > 0
    assert len(calls) == 1 + 3
