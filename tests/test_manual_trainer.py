"""The from-scratch path: identical replicas, the same model on 1 to 4 devices and with every
allreduce (exact in float64, step by step in float32), short final batches and empty shards
trained, and a run that learns."""

import logging
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from conftest import DEVICES
from same_model import comparable_start, head, train_manual, update_difference
from tfdp.cluster.stall import clear_a_lost_peers_errors, read_after_a_loss
from tfdp.config.settings import Config
from tfdp.data import pipeline
from tfdp.paths.manual.replicate import Replicas, split_batch
from tfdp.paths.manual.trainer import ReplicaSteps
from tfdp.paths.manual.step import (StepSettings, exchange_gradients, make_train_step,
                              combined_statistics, replica_gradients, update_replicas)
from tfdp.training.backups import Backups
from tfdp.training.state import TrainingState


def start_params(dtype=np.float32):
    return comparable_start(3, dtype)


def train_params(tmp_path, split, k, allreduce="add_n", batch_size=96, dtype=np.float32,
                 epochs=1):
    config = Config(num_gpus=k, batch_size=batch_size, lr=0.1, epochs=epochs, seed=1,
                    allreduce=allreduce, eval_steps=1, workdir=str(tmp_path / f"{k}-{allreduce}"),
                    precision=np.dtype(dtype).name)
    return train_manual(config, split, split, params=start_params(dtype))[0]


@pytest.mark.parametrize("allreduce", ["add_n", "sharded", "ring"])
def test_replicas_stay_identical(train_split, allreduce):
    replicas = Replicas.place(start_params(), DEVICES[:4])
    step = make_train_step(replicas, StepSettings(allreduce=allreduce))
    steps = 0
    for images, labels in pipeline.train_batches(head(train_split, 1000), 130, 0, 0, 1, 8):
        step(images, labels, tf.constant(0.1))
        steps += 1
    first, *others = replicas.params
    for replica in others:
        for name, var in replica.items():
            np.testing.assert_array_equal(var.numpy(), first[name].numpy(), err_msg=name)
    moved = first["W3"].numpy() - start_params()["W3"]
    assert np.abs(moved).max() > 1e-4  # The steps did update the replicas.
    # Every replica marks the whole steps it holds; one cut short mid-update is passed over.
    assert [[int(m.numpy()) for m in marks] for marks in replicas.marks] == [[steps] * 2] * 4
    assert replicas.survivor(set(DEVICES[:4])) == (0, steps)
    replicas.marks[1][0].assign(steps + 1)
    assert replicas.survivor(set(DEVICES[1:4])) == (2, steps)
    assert replicas.survivor({DEVICES[1]}) == (None, None)


def test_a_loss_backs_up_the_survivors_newer_step_but_not_an_epoch_end_before_its_figures(
        tmp_path):
    """``keep_survivors_step`` with 10 steps an epoch: a step within the epoch newer than the
    newest backup is saved; the one being written behind counts as written; an epoch's last
    step is not saved (the worker was lost while the epoch was evaluated: not yet reported)."""
    replicas = Replicas.place(start_params(), DEVICES[:2])
    backups = Backups(str(tmp_path), 0, {})
    state = TrainingState([np.arange(3.0)])
    run = SimpleNamespace(backups=backups, stall=None, first_step=0,
                          plan=SimpleNamespace(steps_per_epoch=10))
    steps = SimpleNamespace(run=run, replicas=replicas, state=lambda d: state)
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("tfdp").addHandler(handler)

    def lost_at(step, behind=None):
        for marks in replicas.marks:
            for mark in marks:
                mark.assign(step)
        if behind is not None:
            backups.save_behind(behind, state)
        ReplicaSteps.keep_survivors_step(steps, lambda: {DEVICES[1]})
        return lines[-1], backups.steps()

    try:
        backups.save(4, state)
        held = f"the replica on {DEVICES[1]} holds step"
        assert lost_at(7) == (f"{held} 7: saved, the step to go on from", [4, 7])
        assert lost_at(9, behind=9) == (f"{held} 9, no newer than the newest backup", [7, 9])
        assert lost_at(20) == (f"{held} 20, the end of epoch 2 before its figures: the newest "
                               "backup, of step 9, is the one to go on from", [7, 9])
    finally:
        logging.getLogger("tfdp").removeHandler(handler)


def test_after_a_loss_a_survivor_is_asked_again_and_the_lost_peers_errors_are_cleared(
        monkeypatch):
    """The lost peer's error comes back from the first ops sent to a worker that was receiving
    its tensors: asked again, a survivor answers; one that is gone raises once the seconds
    given have passed, however many tries that took. The
    executors' errors are cleared, in at most the seconds given (clearing waits for pending
    operations, which a hung worker never finishes)."""
    calls = []

    def read(fails: int):
        calls.append(fails)
        if len(calls) <= fails:
            raise tf.errors.UnavailableError(None, None, "failed to connect to the lost peer")
        return "read"

    assert read_after_a_loss(lambda: read(2), pause=0) == "read" and len(calls) == 3
    calls.clear()
    started = time.monotonic()
    with pytest.raises(tf.errors.UnavailableError):
        read_after_a_loss(lambda: read(10 ** 6), seconds=0.3, pause=0.01)
    assert 0.3 - 0.02 < time.monotonic() - started < 5 and len(calls) > 3

    clear_a_lost_peers_errors()  # The real one, on this process's context: nothing pending.
    asked, release = threading.Event(), threading.Event()
    monkeypatch.setattr(type(context.context()), "clear_executor_errors",
                        lambda self: (asked.set(), release.wait()))
    started = time.monotonic()
    clear_a_lost_peers_errors(seconds=0.2)
    assert asked.is_set() and time.monotonic() - started < 5
    release.set()


@pytest.mark.slow
def test_same_model_on_any_device_count_and_every_allreduce(tmp_path, train_split):
    """Exact in float64: 955 examples in batches of 95 (11 steps; shards of 32 + 32 + 31 on 3
    devices, 24 + 24 + 24 + 23 on 4; the last batch of 5 splits 2 + 1 + 1 + 1)."""
    split = head(train_split, 955)
    start = start_params(np.float64)
    one = train_params(tmp_path, split, 1, batch_size=95, dtype=np.float64)
    assert one["W1"].dtype == np.float64
    for k in (2, 3, 4):
        for allreduce in ("add_n", "sharded", "ring"):
            other = train_params(tmp_path, split, k, allreduce, batch_size=95, dtype=np.float64)
            # Only the order of additions differs: measured about 1e-15.
            assert update_difference(other, one, start) < 1e-9, (k, allreduce)


def test_every_float32_step_agrees_across_devices(train_split):
    """Float32, one step at a time from equal weights, along a 1-device run of 21 steps.

    Whole float32 runs cannot be compared to a fixed bound on every CPU: once a ReLU input that
    many positions share sits within rounding of zero, two correct runs take its kink a step
    apart and drift by percents (conftest.comparable_start). A single step from equal weights
    differs only by the order of its additions. Float32 keeps 24 bits (u = 6e-8); the longest
    sum in LeNet's gradient is W1's, over 95 examples x 26 x 26 positions (64,000 terms), which
    blocked and pairwise summation (Eigen, oneDNN) errs by about u log2(64,000) = 1e-6 of the
    sum of magnitudes. Three or four such sums in sequence (convolutions, shard sums,
    allreduce), and gradients whose terms cancel to a tenth of their magnitude, stay under
    1e-4 of an update (measured: at most 7.7e-6 with oneDNN on; it also passes with it off).
    """
    w = start_params()
    reference_step = _stepper(w, 1, "add_n")
    others = {(k, allreduce): _stepper(w, k, allreduce)
              for k, allreduce in [(2, "add_n"), (3, "ring"), (3, "add_n"), (4, "sharded")]}
    for images, labels in pipeline.train_batches(head(train_split, 2000), 95, 1, 0, 1, 22):
        reference = reference_step(w, images, labels)
        for (k, allreduce), step in others.items():
            assert update_difference(step(w, images, labels), reference, w) < 1e-4, (k, allreduce)
        w = reference


def test_the_three_stages_of_a_step_each_alone(train_split):
    """In float64: the replicas' gradients on their shards add up to one device's on the whole
    batch; the exchange gives every device that sum, whatever the allreduce, its buckets and
    overlap; the update moves every replica by lr x the sum."""
    start = start_params(np.float64)
    images = tf.constant(train_split.images[:90])
    labels = tf.constant(train_split.labels[:90])
    n = tf.constant(90.0, tf.float64)
    one = Replicas.place(start, DEVICES[:1])
    three = Replicas.place(start, DEVICES[:3])
    whole = replica_gradients(one, split_batch(images, labels, DEVICES[:1]), n)[0]
    shards = replica_gradients(three, split_batch(images, labels, DEVICES[:3]), n)
    assert [int(r.size) for r in shards] == [30, 30, 30]
    total = [sum(r.gradients[i] for r in shards) for i in range(len(whole.gradients))]
    for mine, theirs in zip(total, whole.gradients):
        np.testing.assert_allclose(mine, theirs, rtol=1e-9, atol=1e-15)
    assert combined_statistics(three, shards) == {}  # lenet keeps no running statistics.
    for settings in (StepSettings(allreduce="ring"), StepSettings(allreduce="sharded"),
                     StepSettings(allreduce="ring", bucket_kb=4, overlap=False)):
        summed = exchange_gradients([r.gradients for r in shards], DEVICES[:3], settings)
        for per_device in summed:
            for mine, theirs in zip(per_device, total):
                np.testing.assert_allclose(mine, theirs, rtol=1e-12, atol=1e-18)
    update_replicas(three, summed, {}, tf.constant(0.5))
    for params in three.params:
        for (name, var), grad in zip([(k, v) for k, v in params.items()], total):
            np.testing.assert_allclose(var.numpy(), start[name] - 0.5 * grad.numpy(),
                                       rtol=1e-12, atol=1e-15)


def _stepper(params, k, allreduce):
    """One step of the k-device trainer from the weights it is given (compiled once)."""
    replicas = Replicas.place(params, DEVICES[:k])
    step = make_train_step(replicas, StepSettings(allreduce=allreduce))

    def one_step(weights, images, labels):
        for replica in replicas.params:
            for name, var in replica.items():
                var.assign(weights[name])
        step(images, labels, tf.constant(0.1))
        return {name: var.numpy() for name, var in replicas.params[0].items()}

    return one_step


def test_short_final_batch_is_trained_even_with_empty_shards(tmp_path, train_split):
    # 10 examples, batch 4: batches of 4, 4 and 2; on 4 devices the last one splits 1+1+0+0.
    split = head(train_split, 10)
    start = start_params()
    one = train_params(tmp_path, split, 1, batch_size=4)
    four = train_params(tmp_path, split, 4, batch_size=4)
    assert update_difference(four, one, start) < 1e-4  # Three steps: rounding only.
    two_steps = train_params(tmp_path, head(train_split, 8), 1, batch_size=4)
    assert update_difference(two_steps, one, start) > 1e-2  # The short batch counted.


def test_training_learns_and_reports(tmp_path, train_split, test_split):
    config = Config(num_gpus=2, epochs=2, steps_per_epoch=40, eval_steps=8, lr=0.1,
                    workdir=str(tmp_path / "run"))
    _, result = train_manual(config, train_split, test_split, params=start_params())
    first, last = result.history
    assert last["loss"] < first["loss"] < np.log(10)
    assert last["test_acc"] > 0.6
    assert last["epoch"] == 2 and last["examples_per_sec"] > 0
