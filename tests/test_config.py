"""Configuration mistakes are refused with one line naming the flag."""

import math
import os
import re

import pytest

from tfdp.config.plan import global_batch_size, peak_lr
from tfdp.config.settings import Config
from tfdp.util.errors import UserError


@pytest.mark.parametrize("kwargs,words", [
    ({"num_gpus": 0}, "--num_gpus"),
    ({"batch_size": 0}, "--batch_size"),
    ({"epochs": -1}, "--epochs"),
    ({"lr": 0.0}, "--lr"),
    ({"lr": -0.1}, "--lr"),
    ({"lr": math.nan}, "--lr"),
    ({"lr": math.inf}, "--lr"),
    ({"strategy": "horovod"}, "--strategy=horovod"),
    ({"model": "vgg"}, "--model=vgg"),
    ({"allreduce": "tree"}, "--allreduce=tree"),
    ({"init": "zeros"}, "--init=zeros"),
    ({"model": "lenet_bn", "strategy": "parameter_server"},
     "use --strategy=manual, mirrored"),
    ({"batch_size": 64, "per_replica_batch_size": 32}, "not both"),
    ({"steps_per_epoch": 0}, "--steps_per_epoch"),
    ({"manual_dir": "/nonexistent/fashion"}, "--manual_dir"),
    ({"strategy": "mirrored", "steps_per_execution": 4}, "--steps_per_execution=4"),
    ({"steps_per_execution": 2}, "--steps_per_execution"),
    ({"strategy": "plain", "num_gpus": 2}, "--strategy=plain"),
    ({"seed": -1}, "--seed must be an integer from 0 to 4294967295, got -1"),
    ({"target_accuracy": 1.5}, "--target_accuracy must be a fraction in (0, 1], got 1.5"),
    ({"workdir": 5}, "--workdir must be a string, got 5 (int)"),
    ({"num_gpus": True}, "--num_gpus must be an integer, got True (bool)"),
    ({"eager": 1}, "--eager must be True or False, got 1 (int)"),
    ({"lr": "0.1"}, "--lr must be a number, got '0.1' (str)"),
    ({"recipe": "speedy"}, "--recipe=speedy is not one of: textbook, fast"),
    ({"nesterov": True}, "--nesterov needs --momentum > 0"),
    ({"momentum": 1.0}, "--momentum must be in [0, 1), got 1.0"),
    ({"label_smoothing": -0.1}, "--label_smoothing must be in [0, 1)"),
    ({"weight_decay": math.nan}, "--weight_decay must be in [0, 1)"),
    ({"schedule": "cosine"}, "--schedule=cosine is not one of: constant, one_cycle"),
    ({"one_cycle_rise": 1.0}, "--one_cycle_rise must be in (0, 1), got 1.0"),
    ({"augment": "crop"}, "--augment=crop is not one of: none, flip"),
    ({"recipe": "fast", "sync_batch_norm": True}, "--sync_batch_norm is the Keras paths'"),
    ({"strategy": "mirrored", "sync_batch_norm": True},
     "--sync_batch_norm synchronizes tfdp's own batch normalization (lenet_bn, resnet18); "
     "--model=lenet has none"),
    ({"strategy": "mirrored", "sync_batch_norm": True,
      "model": os.path.join(os.path.dirname(__file__), "own_models", "zoo.py:subclassed")},
     "is yours: give its layers keras.layers.BatchNormalization(synchronized=True)"),
    ({"strategy": "parameter_server", "model": "resnet18", "sync_batch_norm": True},
     "--sync_batch_norm: each step of --strategy=parameter_server runs on one worker"),
    ({"recipe": "fast", "accumulate_steps": 2}, "--accumulate_steps=2 with lenet_bn"),
    ({"strategy": "parameter_server", "model": "lenet_bn"}, "--model=lenet_bn: its servers' store"),
    ({"strategy": "parameter_server", "momentum": 0.9}, "--momentum=0.9: asynchronous SGD"),
    ({"recipe": "fast", "init": "/nonexistent.npz"}, "--init=/nonexistent.npz is neither"),
    ({"strategy": "mirrored", "jit_compile": True}, "--jit_compile: under tf.distribute"),
    ({"strategy": "multi_worker", "jit_compile": True}, "--jit_compile: under tf.distribute"),
    ({"strategy": "parameter_server", "jit_compile": True},
     "--jit_compile: the coordinator schedules"),
])
def test_bad_values_are_refused(kwargs, words):
    with pytest.raises(UserError, match=re.escape(words)) as e:
        Config(**kwargs)
    assert "\n" not in str(e.value)


def test_batch_smaller_than_replicas_is_refused():
    with pytest.raises(UserError, match=r"--batch_size=3 is smaller than the 4 replicas"):
        global_batch_size(Config(batch_size=3), 4)


def test_global_batch_arithmetic():
    assert global_batch_size(Config(), 2) == 256
    assert global_batch_size(Config(batch_size=100), 3) == 100
    assert global_batch_size(Config(per_replica_batch_size=64), 4) == 256
    assert peak_lr(Config(lr=0.1, scale_lr=True), 4) == pytest.approx(0.4)
    assert peak_lr(Config(lr=0.1), 4) == 0.1


def test_thread_shares_follow_tensorflows_thread_variables(monkeypatch):
    from tfdp.util import devices

    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
    intra, inter = devices.thread_shares(2)
    assert intra == max(1, devices.available_cores() // 2) and inter == 2
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "3")
    assert devices.thread_shares(2) == (3, 2)
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "1")
    assert devices.thread_shares(2) == (3, 1)
    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "many")
    with pytest.raises(UserError, match="TF_NUM_INTEROP_THREADS='many': give a positive number"):
        devices.thread_shares(2)


def test_plots_are_the_flag_else_the_environment_else_drawn(monkeypatch):
    monkeypatch.delenv("TFDP_PLOTS", raising=False)
    assert Config().plots_or_default() is True
    for value, drawn in (("0", False), ("false", False), ("1", True), (" True ", True)):
        monkeypatch.setenv("TFDP_PLOTS", value)
        assert Config().plots_or_default() is drawn, value
        assert Config(plots=not drawn).plots_or_default() is (not drawn)  # The flag first.
    monkeypatch.setenv("TFDP_PLOTS", "maybe")
    with pytest.raises(UserError, match=r"^TFDP_PLOTS=maybe: give 0 or 1 \(the default of "
                                        r"--plots\)$"):
        Config().plots_or_default()
