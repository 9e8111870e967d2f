"""The Keras path in-process: mirrored fit on 2 logical devices trains the same LeNet as the
manual path, resumes from its backups, exports the same contract; ResNet-18 builds and trains."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import keras
import tensorflow as tf

from conftest import DEVICES, REPO
from processes import child_env, run_module
from same_model import comparable_start, head, train_manual, update_difference
from tfdp.config.settings import Config
from tfdp.data import pipeline
from tfdp.models import lenet, resnet
from tfdp.models.replicated_batch_norm import ReplicatedBatchNormalization
from tfdp.paths.keras import distributed_input, evaluation, workarounds
from tfdp.training import entry
from tfdp.training.backups import Backups


def common(tmp_path, data_dir, name, **overrides):
    settings = dict(num_gpus=2, batch_size=96, lr=0.1, epochs=1, steps_per_epoch=10, seed=4,
                    eval_steps=2, data_dir=data_dir, workdir=str(tmp_path / name),
                    export_dir=str(tmp_path / f"{name}-exp"))
    settings.update(overrides)
    return settings


@pytest.mark.slow
def test_mirrored_matches_manual_and_exports(tmp_path, data_dir, train_split, test_split):
    # Float64, so the comparison is exact whatever the CPU's kernels (conftest.comparable_start).
    start = comparable_start(7, np.float64)
    manual_config = Config(**common(tmp_path, data_dir, "manual", precision="float64"))
    manual, manual_run = train_manual(manual_config, train_split, test_split, params=start)

    mirrored = entry.train(Config(strategy="mirrored", **common(
        tmp_path, data_dir, "mirrored", precision="float64", plots=True)),
        start_weights=lenet.to_keras_weights(start))

    assert update_difference(lenet.from_keras_weights(mirrored.weights), manual, start) < 1e-9
    assert mirrored.final_line.endswith("sec/epoch on ['/device:CPU:0', '/device:CPU:1']")
    assert "(first 192 of 10000 test examples)" in mirrored.final_line
    assert mirrored.export_path.endswith(os.path.join("mirrored-exp", "1"))
    # Both paths evaluate the same 192 test examples with the same weights.
    assert mirrored.history[-1]["test_acc"] == manual_run.history[-1]["test_acc"]
    metrics = json.loads((tmp_path / "mirrored" / "metrics.json").read_text())
    assert [r["epoch"] for r in metrics["epochs"]] == [1]
    assert (tmp_path / "mirrored" / "accuracy.png").exists()


@pytest.mark.parametrize("k, examples, batch", [
    (3, 335, 95),   # Every batch uneven (32 + 32 + 31); the last one 50 = 17 + 17 + 16.
    (4, 10, 4),     # Batches of 4, 4 and 2: the last one leaves two replicas empty.
    (3, 100, 7),    # Odd batch (3 + 2 + 2); the last batch of 2 leaves one replica empty.
])
@pytest.mark.slow
def test_mirrored_trains_uneven_and_empty_shards_like_manual(tmp_path, data_dir, train_split,
                                                             monkeypatch, k, examples, batch):
    """The Keras step divides every example's loss by the global batch, as the manual path
    does, so the two agree exactly (float64) whatever the shards; empty shards are skipped."""
    split = head(train_split, examples)
    monkeypatch.setattr(pipeline, "load_splits", lambda *args: (split, split))
    start = comparable_start(2, np.float64)
    settings = common(tmp_path, data_dir, f"uneven{k}", num_gpus=k, batch_size=batch,
                      steps_per_epoch=None, eval_steps=None, epochs=2, precision="float64")
    manual, manual_run = train_manual(
        Config(**dict(settings, workdir=str(tmp_path / f"manual{k}"))), split, split,
        params=start)
    mirrored = entry.train(Config(strategy="mirrored", **settings),
                                 start_weights=lenet.to_keras_weights(start))
    assert update_difference(lenet.from_keras_weights(mirrored.weights), manual, start) < 1e-9
    for got, want in zip(mirrored.history, manual_run.history):
        # Keras' trackers hold float32; a count differing by one example would be 1e-3 here.
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
        assert got["train_acc"] == pytest.approx(want["train_acc"], abs=1e-6)
        assert got["test_acc"] == pytest.approx(want["test_acc"], abs=1e-6)


def test_keras_still_needs_the_build_workaround(tmp_path, data_dir):
    """Keras builds the model from the MEAN of the replicas' first batches, which fails when
    their shards differ in size (3 x 33 + 34 here); ``tfdp.paths.keras.workarounds`` builds
    from one replica's batch. A process of its own: the patch, once applied, stays for the
    process."""
    result = run_module("tfdp.train", "--strategy=mirrored", "--num_gpus=3", "--batch_size=100",
                        "--epochs=1", "--steps_per_epoch=1", "--eval_steps=1",
                        f"--data_dir={data_dir}", f"--workdir={tmp_path / 'work'}",
                        f"--export_dir={tmp_path / 'exp'}",
                        env={workarounds.DISABLE_ENV: "1"})
    if result.returncode == 0:
        pytest.fail("Keras fit now builds models from uneven per-replica batches: remove the "
                    "build part of tfdp/paths/keras/workarounds.py and this test")
    assert "AddN" in result.stderr and "same size and shape" in result.stderr, \
        result.stderr[-3000:]


# Two MirroredStrategies of one process, each all-reducing a tensor of its own shape, made as
# TensorFlow makes them (the same key base) or as tfdp does (tfdp.paths.keras.strategy).
TWO_STRATEGIES = """
import sys
import tensorflow as tf
from tfdp import paths
from tfdp.paths.keras import strategy
from tfdp.util import devices
names = devices.configure_devices(2)
base = tf.distribute.MirroredStrategy._collective_key_base


def all_reduced(n):
    if sys.argv[1] == "tfdp":
        s = strategy.make_distribution(paths.MIRRORED, 2).strategy
    else:
        tf.distribute.MirroredStrategy._collective_key_base = base
        s = tf.distribute.MirroredStrategy(names)
    step = tf.function(lambda: s.run(
        lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.ones([n]))))
    return s.experimental_local_results(step())[0].numpy().tolist()


print(all_reduced(3), all_reduced(5))
"""


@pytest.mark.parametrize("keys", ["tensorflow", "tfdp"])
def test_tensorflow_still_needs_a_key_base_per_mirrored_strategy(keys):
    """A second MirroredStrategy's all-reduce of another shape fails on TensorFlow's keys
    (tensorflow/tensorflow#62790) and works on tfdp's. A process each: the failure aborts the
    process's collectives for good."""
    done = subprocess.run([sys.executable, "-c", TWO_STRATEGIES, keys], capture_output=True,
                          text=True, timeout=300, env=child_env(), cwd=REPO)
    if keys == "tfdp":
        assert done.stdout.splitlines()[-1] == "[2.0, 2.0, 2.0] [2.0, 2.0, 2.0, 2.0, 2.0]", (
            done.stderr[-3000:])
    elif done.returncode == 0:
        pytest.fail("TensorFlow now gives each MirroredStrategy keys of its own: remove "
                    "_mirrored_strategy's key base from tfdp/paths/keras/strategy.py and this "
                    "test")
    else:
        assert "Shape mismatch in the collective instance" in done.stderr, done.stderr[-3000:]


SIGTERM_KEPT = """
import ctypes, json, os, signal, socket, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}"]},
                                      "task": {"type": "worker", "index": 0}})
libc = ctypes.CDLL(None)


class Action(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


def handler():  # The process's SIGTERM handler, as the kernel has it.
    action = Action()
    libc.sigaction(signal.SIGTERM, None, ctypes.byref(action))
    return action.handler


from tfdp.training import preemption

preemption.hold_until_main()  # As tfdp's command lines start: before TensorFlow's import.
import time
import tensorflow as tf
from tfdp.paths.keras.strategy import sigterm_kept

caught = []
with preemption.preempt_outside_runs():
    signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    python = handler()
    with sigterm_kept():
        tf.distribute.MultiWorkerMirroredStrategy()
        replaced = handler() != python
        os.kill(os.getpid(), signal.SIGTERM)  # Held until the handler is Python's again.
    for _ in range(100):  # Python runs the handler between two bytecodes of this thread.
        if caught:
            break
        time.sleep(0.01)
print(json.dumps({"replaced": replaced, "kept": handler() == python, "caught": caught}))
"""


def test_a_sigterm_after_a_multi_worker_strategy_is_created_still_reaches_tfdp():
    """Creating a MultiWorkerMirroredStrategy puts TensorFlow's own SIGTERM handler in the
    process's place, behind Python's back; ``strategy.sigterm_kept`` puts Python's back, and a
    SIGTERM sent meanwhile reaches it. Fails once TensorFlow no longer replaces the handler
    (then the workaround can go)."""
    done = subprocess.run([sys.executable, "-c", SIGTERM_KEPT], capture_output=True, text=True,
                          timeout=300, env=child_env(), cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["replaced"], ("TensorFlow no longer replaces the SIGTERM handler when a "
                              "MultiWorkerMirroredStrategy is created: remove sigterm_kept "
                              "from tfdp/paths/keras/strategy.py and this test")
    assert seen["kept"] and seen["caught"] == [15], seen


@pytest.mark.parametrize("layer, one_value", [(keras.layers.BatchNormalization, False),
                                              (ReplicatedBatchNormalization, True)])
def test_batch_norm_moving_statistics_are_one_value_across_replicas(layer, one_value):
    """Two replicas see different batches. Keras' own layer moves each replica's copy of its
    statistics alone, and reads return replica 0's: once it keeps one value, this test fails,
    and tfdp/models/replicated_batch_norm.py can go (ResNet-18 uses Keras' layer again)."""
    strategy = tf.distribute.MirroredStrategy(DEVICES[:2])
    with strategy.scope():
        norm = layer(momentum=0.5)
        norm.build((None, 3))
    batches = strategy.experimental_distribute_values_from_function(
        lambda context: tf.fill([4, 3], 10.0 * context.replica_id_in_sync_group))

    @tf.function
    def step(x):
        strategy.run(lambda x: norm(x, training=True), args=(x,))

    step(batches)
    copies = [v.numpy() for v in norm.moving_mean.value.values]
    if one_value:
        # The mean of the replicas' updates: 0.5 x 0 + 0.5 x (0 + 10) / 2.
        assert np.array_equal(copies[0], copies[1]) and np.allclose(copies[0], 2.5), copies
        assert np.allclose(norm.moving_mean.numpy(), 2.5)
    else:
        assert not np.array_equal(copies[0], copies[1]), (
            "Keras' BatchNormalization now keeps one value across replicas: remove "
            "tfdp/models/replicated_batch_norm.py and this test's workaround half")


def test_evaluator_covers_the_same_batches_every_time(test_split):
    """2 replicas, 3 batches of 96, 96 and 8 (shards of 48 and 4): the sums are global and
    exact, the confusion matrix the one counted by hand."""
    split = head(test_split, 200)
    strategy = tf.distribute.MirroredStrategy(DEVICES[:2])
    with strategy.scope():
        model = lenet.keras_model()
        model.set_weights(lenet.to_keras_weights(comparable_start(5)))
    batches = pipeline.eval_batches(split, 96).repeat()
    evaluator = evaluation.Evaluator(model, strategy,
                                     distributed_input.distribute(strategy, batches, 2), steps=3)

    logits = model(pipeline.to_float(split.images), training=False)
    loss = float(np.mean(keras.losses.sparse_categorical_crossentropy(
        split.labels, logits, from_logits=True)))
    predicted = np.argmax(logits, axis=-1)
    accuracy = float(np.mean(predicted == split.labels))
    by_hand = np.zeros((10, 10), np.int64)  # Row: the true class; column: the predicted one.
    for true, guess in zip(split.labels, predicted):
        by_hand[true, guess] += 1
    for _ in range(2):  # The second pass starts where the first began: one pass each time.
        got_loss, got_accuracy, got_confusion = evaluator.evaluate()
        assert got_accuracy == pytest.approx(accuracy, abs=1e-9)
        assert got_loss == pytest.approx(loss, rel=1e-5)
        assert np.array_equal(got_confusion, by_hand)


@pytest.mark.slow
def test_mirrored_resumes_from_the_last_backup(tmp_path, data_dir, capsys, monkeypatch):
    settings = common(tmp_path, data_dir, "resume", steps_per_epoch=5, eval_steps=1, epochs=3)
    start = lenet.to_keras_weights(comparable_start(1))
    full = entry.train(Config(strategy="mirrored", **dict(
        settings, workdir=str(tmp_path / "full"), export_dir=str(tmp_path / "full-exp"))),
        start_weights=start)
    assert not os.path.exists(tmp_path / "full" / "backup")  # Spent.

    save = Backups.save_behind  # An epoch's backup, written behind training.

    def crash_after_epoch_2(self, step, weights):
        path = save(self, step, weights)
        self.wait()  # Whole on disk before the crash: the test reads it at once.
        if step == 10:
            raise RuntimeError("simulated crash")
        return path

    monkeypatch.setattr(Backups, "save_behind", crash_after_epoch_2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        entry.train(Config(strategy="mirrored", **settings), start_weights=start)
    monkeypatch.undo()
    assert Backups(str(tmp_path / "resume"), 0, {}).steps() == [5, 10]
    assert not os.path.exists(tmp_path / "resume-exp") or not os.listdir(tmp_path / "resume-exp")
    capsys.readouterr()

    resumed = entry.train(Config(strategy="mirrored", **settings), start_weights=start)
    out = capsys.readouterr().out
    assert "resuming at epoch 3/3, step 0/5 (global step 10)" in out
    assert out.count("epoch 3/3: loss") == 1 and "epoch 1/3: loss" not in out
    assert [r["epoch"] for r in resumed.history] == [1, 2, 3]
    metrics = json.loads((tmp_path / "resume" / "metrics.json").read_text())
    assert [r["epoch"] for r in metrics["epochs"]] == [1, 2, 3]
    for x, y in zip(full.weights, resumed.weights):  # As if it had never stopped.
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert os.listdir(tmp_path / "resume-exp") == ["1"]


@pytest.mark.slow
def test_resnet18_has_the_expected_size_and_trains(tmp_path, data_dir):
    assert resnet.resnet().count_params() == 11_183_626  # 11.2 M, 7,808 of them BN statistics
    # A process of its own: a second MirroredStrategy in one process reuses collective instance
    # keys, and sync batch norm's collectives then clash with an earlier strategy's.
    result = run_module("tfdp.train", "--strategy=mirrored", "--model=resnet18", "--num_gpus=2",
                        "--sync_batch_norm", "--batch_size=16", "--epochs=1",
                        "--steps_per_epoch=3", "--eval_steps=1", f"--data_dir={data_dir}",
                        f"--workdir={tmp_path / 'work'}", f"--export_dir={tmp_path / 'exp'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "MirroredStrategy, 2 replica(s) in sync" in result.stderr
    assert "global batch 16 = 8 + 8 per replica" in result.stderr
    record = json.loads((tmp_path / "work" / "metrics.json").read_text())["epochs"][-1]
    assert np.isfinite(record["loss"]) and record["epoch"] == 1
    assert os.listdir(tmp_path / "exp") == ["1"]


def test_keras_is_the_minor_version_the_workarounds_patch():
    """setup.cfg pins Keras to 3.15.x: paths/keras/workarounds.py replaces
    keras.src.backend.tensorflow.trainer's reduce_per_replica and
    TensorFlowTrainer._maybe_symbolic_build, and paths/keras/distributed_input.py relies on
    tf.distribute's input_lib as Keras 3.15 feeds it. This notices a moved pin."""
    from keras.src.backend.tensorflow import trainer

    assert keras.version().startswith("3.15."), (
        f"Keras {keras.version()}: before moving the pin in setup.cfg, check that "
        "keras.src.backend.tensorflow.trainer still has reduce_per_replica and "
        "TensorFlowTrainer._maybe_symbolic_build with the same signatures, run "
        "tests/test_keras_path.py and tests/test_multi_worker.py (their *_still_needs_* and "
        "*_still_ours_to_build tests say whether each workaround is still needed), then "
        "update this test")
    assert callable(trainer.reduce_per_replica)
    assert callable(trainer.TensorFlowTrainer._maybe_symbolic_build)

