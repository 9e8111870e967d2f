"""The cadence of synchronisation (--sync_every, section 12.2): N steps per compiled call train
bit for bit what one step per call trains, a divergence inside a window stops the run naming
its step and exporting nothing, a real SIGTERM inside a window saves the window's last step
(every replica finished it) and the resumed run ends on the uninterrupted run's bits."""

import os
import signal
import threading

import numpy as np
import pytest

from tfdp.config.settings import Config
from tfdp.paths.manual.trainer import ReplicaSteps
from tfdp.training import entry
from tfdp.util.errors import Diverged, Preempted, UserError


def settings(tmp_path, data_dir, name, **overrides):
    flags = dict(num_gpus=2, batch_size=64, epochs=2, steps_per_epoch=20, eval_steps=1, seed=3,
                 init="glorot", data_dir=data_dir, workdir=str(tmp_path / name),
                 export_dir=str(tmp_path / f"{name}-exp"))
    flags.update(overrides)
    return Config(**flags)


def test_n_steps_per_call_train_the_same_bits_as_one(tmp_path, data_dir):
    """20 steps an epoch in windows of 7 (7 + 7 + 6: the last one short) against 1 a call."""
    one = entry.train(settings(tmp_path, data_dir, "one", sync_every=1))
    seven = entry.train(settings(tmp_path, data_dir, "seven", sync_every=7))
    for x, y in zip(one.weights, seven.weights):
        np.testing.assert_array_equal(x, y)
    learned = ("epoch", "loss", "train_acc", "test_loss", "test_acc")  # Not the timings.
    assert ([{k: r[k] for k in learned} for r in one.history]
            == [{k: r[k] for k in learned} for r in seven.history])


def test_a_divergence_inside_a_window_stops_naming_its_step_and_exports_nothing(tmp_path,
                                                                               data_dir):
    named = []
    for n in (1, 8):
        with pytest.raises(Diverged) as diverged:
            entry.train(settings(tmp_path, data_dir, f"lr50-{n}", lr=50.0, init="textbook",
                                  sync_every=n, epochs=1, steps_per_epoch=30))
        named.append(diverged.value.step)
        exports = tmp_path / f"lr50-{n}-exp"
        assert not exports.exists() or not os.listdir(exports)
    assert named[0] == named[1]  # The step itself, not the end of its window.
    assert named[1] % 8 != 0  # Inside a window: what this test is about.


@pytest.mark.parametrize("call", [1, 4, 5])  # Mid-epoch; the short last window; the next epoch.
@pytest.mark.slow
def test_a_sigterm_inside_a_window_saves_its_end_and_resumes_to_the_same_bits(
        tmp_path, data_dir, monkeypatch, call):
    full = entry.train(settings(tmp_path, data_dir, "full", sync_every=6))
    issue, issued = ReplicaSteps.issue, []

    def issue_and_signal(self, batches, first_step, count):
        issued.append((first_step, count))
        if len(issued) == call:  # A real signal, from another thread, while the window runs.
            threading.Timer(0.002, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return issue(self, batches, first_step, count)

    monkeypatch.setattr(ReplicaSteps, "issue", issue_and_signal)
    with pytest.raises(Preempted) as stopped:
        entry.train(settings(tmp_path, data_dir, "run", sync_every=6))
    monkeypatch.undo()
    # Windows start at steps 0, 6, 12, 18 (2 steps), 20, 26, ...: saved at a window's end.
    first, count = issued[call - 1]
    assert stopped.value.step == first + count, (issued, str(stopped.value))
    assert f"saved in {tmp_path / 'run'}" in str(stopped.value)

    resumed = entry.train(settings(tmp_path, data_dir, "run", sync_every=1))  # Any cadence.
    for x, y in zip(full.weights, resumed.weights):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("strategy, why", [
    ("plain", "Keras fit's own is --steps_per_execution"),
    ("mirrored", "under tf.distribute Keras' multi-step loop"),
    ("parameter_server", "the coordinator already runs up to two steps per worker ahead")])
def test_sync_every_elsewhere_is_a_one_line_error_saying_why(strategy, why):
    with pytest.raises(UserError, match=rf"^--sync_every=4 is --strategy=manual's \(.*\): {why}"):
        Config(strategy=strategy, sync_every=4)
    assert Config(strategy=strategy).steps_between_syncs == 1
    assert Config(strategy=strategy, sync_every=1).steps_between_syncs == 1
