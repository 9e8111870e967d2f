"""Gradient accumulation (--accumulate_steps): K micro-batches of B train the model one batch of
K x B would (exact in float64), on the from-scratch path and under Keras' MirroredStrategy, on
1 and 2 devices, with uneven and empty micro-batches; the plan counts updates; one allreduce per
update; Keras' own option still fails under a strategy (keras-team/keras#20582)."""

import numpy as np
import pytest

import keras
import tensorflow as tf

from conftest import DEVICES
from same_model import comparable_start, head, train_manual, update_difference
from tfdp.config.plan import make_plan
from tfdp.config.settings import Config
from tfdp.data import pipeline
from tfdp.models import lenet
from tfdp.paths.keras import train_step
from tfdp.paths.manual import allreduce as allreduce_module
from tfdp.paths.manual.replicate import Replicas
from tfdp.paths.manual.step import StepSettings, make_train_step
from tfdp.training import entry
from tfdp.util.errors import UserError


def manual_params(tmp_path, split, k, name, **flags):
    config = Config(num_gpus=k, lr=0.1, epochs=2, seed=5, eval_steps=1, precision="float64",
                    workdir=str(tmp_path / name), **flags)
    return train_manual(config, split, split, params=comparable_start(4, np.float64))[0]


@pytest.mark.parametrize("k, examples, micro, accumulate", [
    (1, 400, 24, 4),   # Updates of 96; the last of each epoch 16: micro-batches 4 + 4 + 4 + 4.
    (2, 400, 25, 4),   # Shards of 50 = 13 + 13 + 12 + 12; the last update's 8 + 8: 2 + 2 + 2 + 2.
    (2, 10, 2, 4),     # Updates of 8, then 2: shards of 1, micro-batches 1 + 0 + 0 + 0 (empty).
])
@pytest.mark.slow
def test_k_micro_batches_train_the_model_one_batch_of_k_times_b_does(tmp_path, train_split, k,
                                                                      examples, micro,
                                                                      accumulate):
    split = head(train_split, examples)
    start = comparable_start(4, np.float64)
    whole = manual_params(tmp_path, split, k, "whole", batch_size=micro * accumulate)
    accumulated = manual_params(tmp_path, split, k, "accumulated", batch_size=micro,
                                accumulate_steps=accumulate)
    # Only the order of additions differs (measured about 1e-15).
    assert update_difference(accumulated, whole, start) < 1e-9


@pytest.mark.slow
def test_mirrored_accumulates_like_the_manual_path_and_like_one_large_batch(
        tmp_path, data_dir, train_split, monkeypatch):
    split = head(train_split, 400)
    monkeypatch.setattr(pipeline, "load_splits", lambda *args: (split, split))
    start = comparable_start(4, np.float64)
    manual = manual_params(tmp_path, split, 2, "manual", batch_size=25, accumulate_steps=4)
    micro_batches = []
    pad = train_step._pad_empty_shard
    monkeypatch.setattr(train_step, "_pad_empty_shard",
                        lambda *args: micro_batches.append(1) or pad(*args))
    settings = dict(num_gpus=2, lr=0.1, epochs=2, seed=5, eval_steps=1, precision="float64",
                    data_dir=data_dir, export_dir=str(tmp_path / "exports"))
    mirrored = entry.train(Config(strategy="mirrored", batch_size=25, accumulate_steps=4,
                                   workdir=str(tmp_path / "mirrored"), **settings),
                            start_weights=lenet.to_keras_weights(start))
    assert micro_batches and len(micro_batches) % 8 == 0  # 4 on each replica, every trace.
    whole = entry.train(Config(strategy="mirrored", batch_size=100,
                                workdir=str(tmp_path / "mirrored-whole"), **settings),
                         start_weights=lenet.to_keras_weights(start))
    accumulated = lenet.from_keras_weights(mirrored.weights)
    assert update_difference(accumulated, manual, start) < 1e-9
    assert update_difference(accumulated, lenet.from_keras_weights(whole.weights), start) < 1e-9
    for got, want in zip(mirrored.history, whole.history):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
        assert got["train_acc"] == pytest.approx(want["train_acc"], abs=1e-6)


def test_one_allreduce_per_update_whatever_k(train_split, monkeypatch):
    """The allreduce is traced once into the step, on the summed gradients: K micro-batches
    add no communication (the K-1 before the last send nothing)."""
    calls, forward = [], []
    add_n = allreduce_module.ALLREDUCE["add_n"]
    monkeypatch.setitem(allreduce_module.ALLREDUCE, "add_n",
                        lambda grads, devices: calls.append(len(grads)) or add_n(grads, devices))
    logits = lenet.logits
    monkeypatch.setattr(lenet, "logits", lambda params, x, *args: forward.append(x.device) or
                        logits(params, x, *args))
    replicas = Replicas.place(comparable_start(4), DEVICES[:2])
    step = make_train_step(replicas, StepSettings(accumulate=8))
    for images, labels in pipeline.train_batches(head(train_split, 256), 128, 0, 0, 1, 2):
        step(images, labels, tf.constant(0.1))
    assert calls == [2]  # One trace, one allreduce over the two replicas' summed gradients.
    assert len(forward) == 16  # Traced once: 8 micro-batches on each of the 2 devices.


def test_the_plan_counts_updates_and_says_so():
    plan = make_plan(Config(num_gpus=2, batch_size=256, accumulate_steps=8, scale_lr=True,
                            warmup_epochs=2), 2, 60000, 10000)
    assert (plan.global_batch, plan.per_replica_batch, plan.micro_batch) == (2048, (1024, 1024),
                                                                             256)
    assert plan.steps_per_epoch == 30 and plan.warmup_steps == 60  # Updates, not micro-steps.
    assert plan.eval_examples == 10000
    line = plan.describe("2 device(s)")
    assert ("global batch 2048 = 1024 + 1024 per replica, accumulated from 8 micro-batches of "
            "256 (steps below are updates); 30 steps/epoch; lr 0.4 after 60 warmup steps") in line
    assert "accumulated" not in make_plan(Config(num_gpus=2), 2, 60000, 10000).describe("")


def test_accumulation_with_parameter_servers_is_a_one_line_error():
    with pytest.raises(UserError, match=r"^--accumulate_steps=4 saves the allreduces of "
                                        r"synchronous training; parameter servers .* raise "
                                        r"--batch_size instead$"):
        Config(strategy="parameter_server", accumulate_steps=4)
    with pytest.raises(UserError, match="--accumulate_steps must be a positive integer"):
        Config(accumulate_steps=0)


def test_keras_own_gradient_accumulation_still_fails_under_a_strategy():
    """keras-team/keras#20582: SGD(gradient_accumulation_steps=...) under MirroredStrategy
    raises in fit. When this test fails, Keras' option works under strategies: tfdp's own
    accumulation in ``tfdp.paths.keras.train_step`` may then give way to it."""
    strategy = tf.distribute.MirroredStrategy(DEVICES[:2])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                      loss="mse")
    x, y = np.ones((16, 4), "float32"), np.ones((16, 2), "float32")
    with pytest.raises(RuntimeError, match="merge_call"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
