"""The fast recipe (``--recipe=fast``, issue 34): each of its choices computes what Keras
computes, and the recipe trains the same model on 1, 2 and 4 devices, on the from-scratch path
and under Keras ``fit``, and after a resume, exactly in float64."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from same_model import update_difference
from tfdp.config import recipes
from tfdp.config.plan import make_plan, one_cycle
from tfdp.config.settings import Config
from tfdp.data import pipeline
from tfdp.models import lenet, lenet_batch_norm
from tfdp.models.averaging import Averaging, averaged
from tfdp.models.loss import confusion_of, cross_entropy
from tfdp.models.optimizers import Optimizer
from tfdp.training import entry
from tfdp.training.backups import Backups


def test_the_recipe_fills_only_the_flags_left_unset():
    fast = Config(recipe="fast")
    assert (fast.model, fast.batch_size, fast.lr, fast.momentum, fast.nesterov, fast.schedule,
            fast.one_cycle_rise, fast.augment, fast.eval_flip, fast.initializer, fast.ema,
            fast.epochs) == ("lenet_bn", 128, 0.5, 0.9, True, "one_cycle", 0.15, "flip", True,
                             "glorot", 0.975, 2)
    # The plan's rate peaks at the recipe's share of the run's steps.
    plan = make_plan(fast, 2, 60000, 10000)
    rates = [plan.learning_rate(step) for step in range(plan.total_steps + 1)]
    assert rates.index(max(rates)) == round(0.15 * 2 * 469) and max(rates) == 0.5
    assert Config(recipe="fast", model="lenet", lr=0.1).model == "lenet"
    assert Config(recipe="fast", per_replica_batch_size=64).batch_size is None
    textbook = Config()
    assert (textbook.model, textbook.lr, textbook.momentum, textbook.schedule,
            textbook.label_smoothing, textbook.initializer) == (
        "lenet", 0.2, 0.0, "constant", 0.0, "textbook")
    # On parameter servers the recipe keeps what asynchronous SGD can take.
    served = Config(recipe="fast", strategy="parameter_server")
    assert (served.model, served.momentum, served.label_smoothing) == ("lenet", 0.0, 0.1)
    # Under tf.distribute it runs 3 epochs; the textbook recipe is the same on every path.
    assert [Config(recipe="fast", strategy=s, num_gpus=2).epochs
            for s in ("manual", "mirrored")] == [2, 3]
    assert Config(recipe="fast", strategy="multi_worker").epochs == 3
    assert Config(recipe="fast", strategy="mirrored", num_gpus=2, epochs=2).epochs == 2
    assert Config(strategy="mirrored", num_gpus=2).epochs == 10
    # What the run's line says the path changed: not what the user gave.
    assert recipes.changed(Config(recipe="fast", strategy="mirrored", num_gpus=2)) == [
        "epochs=2 to 3"]
    assert recipes.changed(Config(recipe="fast", strategy="mirrored", num_gpus=2,
                                  epochs=5)) == []
    assert recipes.changed(served)[0] == "model=lenet_bn to lenet"
    assert recipes.changed(Config(strategy="parameter_server")) == []


def test_one_cycle_rises_to_the_peak_then_falls_to_zero_alike_in_python_and_tensors():
    rates = [one_cycle(step, 0.4, 20, 0.25) for step in range(21)]
    assert rates[0] == pytest.approx(0.04) and rates[5] == pytest.approx(0.4)
    assert rates[20] == 0 and max(rates) == rates[5]
    assert all(a < b for a, b in zip(rates[:5], rates[1:6]))
    assert all(a > b for a, b in zip(rates[5:20], rates[6:21]))
    tensors = [float(one_cycle(tf.constant(step, tf.int64), 0.4, 20, 0.25))
               for step in range(21)]
    np.testing.assert_allclose(tensors, rates, rtol=1e-6)


def test_label_smoothing_is_keras_categorical_cross_entropy_of_the_one_hot_labels():
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(6, 10)))
    labels = tf.constant(rng.integers(0, 10, 6))
    keras_loss = keras.losses.categorical_crossentropy(
        tf.one_hot(labels, 10, dtype=tf.float64), logits, from_logits=True, label_smoothing=0.1)
    np.testing.assert_allclose(cross_entropy(logits, labels, 0.1), keras_loss, rtol=1e-12)
    assert not np.allclose(cross_entropy(logits, labels, 0.0), keras_loss)


def test_the_confusion_matrix_every_path_counts_is_tensorflows():
    """``tfdp.models.loss.confusion_of`` (one scatter) against ``tf.math.confusion_matrix``:
    random batches, an empty one (an empty shard's), Keras' float32 counts, compiled."""
    rng = np.random.default_rng(0)
    counted = tf.function(confusion_of, autograph=False)
    for n in (0, 1, 100):
        labels, predicted = (tf.constant(rng.integers(0, 10, n), tf.int32) for _ in range(2))
        for dtype in (tf.int64, tf.float32):
            expected = tf.math.confusion_matrix(labels, predicted, 10, dtype=dtype)
            got = counted(labels, predicted, 10, dtype)
            assert got.dtype == dtype and got.shape == (10, 10)
            np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_the_fused_batch_norm_computes_what_the_moments_path_computes(monkeypatch):
    """float32 training normalizes the first layer folded into its convolution, the others in
    FusedBatchNormV3 (or the moments where oneDNN's kernel is the slower); float64 (every
    equivalence test) in the moments path. Both give the same logits, gradients and batch
    statistics."""
    rng = np.random.default_rng(2)
    params = {name: tf.Variable(value) for name, value in
              lenet.init_params(3, init="glorot", batch_norm=True).items()}
    images = tf.constant(rng.integers(0, 256, (64, 28, 28, 1)), tf.uint8)
    labels = tf.constant(rng.integers(0, 10, 64))

    def train_pass():
        stats = []
        with tf.GradientTape() as tape:
            logits = lenet.logits(params, images, batch_stats=stats)
            loss = tf.reduce_mean(cross_entropy(logits, labels, 0.1))
        grads = tape.gradient(loss, list(lenet.trainable(params).values()))
        return logits, grads, [t for pair in stats for t in pair]

    fused = train_pass()
    monkeypatch.setattr(lenet_batch_norm, "fused", lambda compute: False)
    moments = train_pass()
    np.testing.assert_allclose(fused[0], moments[0], rtol=1e-4, atol=1e-5)
    for mine, theirs in zip(fused[1] + fused[2], moments[1] + moments[2]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-3, atol=1e-5)
    # The dense layer's 64 examples: a variance off by Bessel's 64/63 would fail above.
    assert len(fused[2]) == 6 and fused[2][5].shape == (128,)
    # So the first pass took every route: layer 1 folded, layer 2's 50 channels the moments,
    # the dense layer's 128 the fused kernel.
    assert [params[f"W{i}"].shape[-1] % lenet_batch_norm.FUSED_CHANNELS for i in (2, 3)] == [
        2, 0]


def test_the_from_scratch_averages_are_keras_use_ema():
    """``--ema``: the first step sets the average to the weight, later steps move it."""
    rng = np.random.default_rng(3)
    start = rng.normal(size=(3, 4))
    mine, theirs = tf.Variable(start), keras.Variable(start)
    averaging, sgd = Averaging(0.8), Optimizer(momentum=0.9)
    average, started = averaging.averages({"w": mine})["w"], tf.Variable(False)
    velocity = sgd.slots({"w": mine})["w"]
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9, use_ema=True, ema_momentum=0.8)
    optimizer.build([theirs])
    for _ in range(4):
        grad = rng.normal(size=(3, 4))
        sgd.update(mine, tf.constant(grad), 0.1, velocity)
        averaging.update(average, mine, started)
        started.assign(True)
        optimizer.apply_gradients([(tf.constant(grad), theirs)])
    keras_average = optimizer._model_variables_moving_average[0]
    np.testing.assert_allclose(average.numpy(), keras.ops.convert_to_numpy(keras_average),
                               rtol=1e-12)
    assert not np.allclose(average.numpy(), mine.numpy())
    assert averaged({"w": mine, "s": 1}, {"w": average})["w"] is average


def test_flips_depend_on_seed_epoch_and_example_only_and_reach_every_path(train_split):
    split = pipeline.Split(train_split.images[:64], train_split.labels[:64])
    local = [(x.numpy(), y.numpy()) for x, y in pipeline.train_batches(split, 16, 3, 0, 2, 4, flip=True)]
    indices = [i[0] for i in pipeline.index_batches(64, 16, 3, 0, 0, 2, 4, flip=True)]
    images, labels = tf.constant(split.images), tf.constant(split.labels)
    for (x, y), index in zip(local, indices):  # What a cluster's worker gathers is the same.
        gathered = pipeline.gather(images, labels, index, flip=True)
        np.testing.assert_array_equal(gathered[0], x)
        np.testing.assert_array_equal(gathered[1], y)
    mirrored = np.concatenate([i.numpy() >= 64 for i in indices])
    assert 0.3 < mirrored.mean() < 0.7  # About half, and not the same half each epoch.
    assert not np.array_equal(mirrored[:64][np.argsort(indices[0].numpy() % 64)],
                              mirrored[64:])
    plain = [x.numpy() for x, _ in pipeline.train_batches(split, 16, 3, 0, 2, 4)]
    flipped = np.concatenate([i.numpy() for i in indices]) >= 64
    first = np.concatenate(plain)[flipped]
    np.testing.assert_array_equal(np.concatenate([x for x, _ in local])[flipped],
                                  first[:, :, ::-1])


def settings(tmp_path, data_dir, name, **overrides):
    return dict(dict(recipe="fast", num_gpus=2, batch_size=96, lr=0.2, epochs=2,
                     steps_per_epoch=5, seed=4, eval_steps=2, precision="float64", ema=0.9,
                     data_dir=data_dir, workdir=str(tmp_path / name),
                     export_dir=str(tmp_path / f"{name}-exp")), **overrides)


@pytest.mark.slow
def test_the_fast_recipe_trains_the_same_lenet_on_1_2_and_4_devices(tmp_path, data_dir):
    """Momentum, Nesterov, weight decay, one-cycle, label smoothing, flips, the flipped
    evaluation and weight averaging, in float64: the device count changes nothing but
    rounding. (lenet_bn's batch statistics are each replica's shard's, as under Keras: they
    differ with the device count by design, and the test below compares them across paths.)"""
    start = lenet.init_params(2, np.float64, "glorot")
    runs = {k: entry.train(Config(**settings(tmp_path, data_dir, f"k{k}", num_gpus=k,
                                           model="lenet")),
                         start_weights=lenet.to_keras_weights(start)) for k in (1, 2, 4)}
    one = lenet.from_keras_weights(runs[1].weights)
    for k in (2, 4):
        assert update_difference(lenet.from_keras_weights(runs[k].weights), one, start) < 1e-9
        assert runs[k].history[-1]["test_acc"] == runs[1].history[-1]["test_acc"]


@pytest.mark.slow
def test_the_from_scratch_path_and_keras_fit_train_the_same_lenet_bn(tmp_path, data_dir):
    """The whole fast recipe, lenet_bn's running statistics included, on 2 replicas, with
    weight averaging: both return (and evaluate) the averages, Keras' after ``fit`` ends."""
    start = lenet.init_params(5, np.float64, "glorot", batch_norm=True)
    manual, mirrored = (entry.train(Config(**settings(tmp_path, data_dir, strategy,
                                                    strategy=strategy)),
                                  start_weights=lenet.to_keras_weights(start))
                        for strategy in ("manual", "mirrored"))
    assert len(manual.weights) == len(mirrored.weights) == 17
    ours, theirs = (lenet.from_keras_weights(r.weights) for r in (manual, mirrored))
    assert update_difference(ours, theirs, start) < 1e-9
    assert not np.allclose(ours["mm2"], start["mm2"])  # The statistics moved...
    assert manual.history[-1]["test_acc"] == mirrored.history[-1]["test_acc"]  # ...and serve.


def test_a_resumed_fast_run_goes_on_with_its_velocities(tmp_path, data_dir, monkeypatch):
    """Momentum's velocities and the weights' averages are in the backups: resumed after a
    crash (an exception, after epoch 1's backup), the run ends where one that never stopped
    ends (without them it would not). Every path, stopped by real signals within an epoch with
    the same recipe in float64: tests/test_resume_exactly.py."""
    common = settings(tmp_path, data_dir, "resume", strategy="manual", epochs=3)
    full = entry.train(Config(**dict(common, workdir=str(tmp_path / "full"),
                                   export_dir=str(tmp_path / "full-exp"))))
    save = Backups.save_behind  # An epoch's backup, written behind training.

    def crash_after_epoch_1(self, step, state):
        path = save(self, step, state)
        self.wait()  # Whole on disk before the crash: the test reads it at once.
        if step == 5:
            raise RuntimeError("simulated crash")
        return path

    monkeypatch.setattr(Backups, "save_behind", crash_after_epoch_1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        entry.train(Config(**common))
    monkeypatch.undo()
    state = Backups(common["workdir"], 0, {}).load(5)
    # The 17 weights, and the 11 trained ones' velocities and averages.
    assert [len(state.weights), len(state.slots), len(state.averages)] == [17, 11, 11]
    resumed = entry.train(Config(**common))
    for x, y in zip(full.weights, resumed.weights):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    metrics = json.loads((tmp_path / "resume" / "metrics.json").read_text())
    assert metrics["config"]["recipe"] == "fast" and metrics["schedule"] == "one_cycle"
    assert os.listdir(tmp_path / "resume-exp") == ["1"]


def test_a_fast_export_serves_the_flipped_mean_it_was_evaluated_with(tmp_path, data_dir,
                                                                      test_split):
    result = entry.train(Config(**settings(tmp_path, data_dir, "served", precision="float32",
                                         epochs=1)))
    served = tf.saved_model.load(result.export_path).signatures["serving_default"]
    images = test_split.images[:64]
    model = lenet.serving_model(lenet.from_keras_weights(result.weights))
    x = pipeline.to_float(tf.constant(images))
    both = (model(x, training=False) + model(pipeline.mirror(x), training=False)) / 2
    np.testing.assert_allclose(served(images=tf.constant(images))["logits"], both, atol=1e-5)
    assert not np.allclose(both, model(x, training=False), atol=1e-3)
