"""Models nobody here wrote, trained as Keras trains them (issue 58): the layers and habits of
Keras' guides (Dropout and every other seeded layer, regularizers and ``add_loss``, a softmax
head, a subclassed model, a vision transformer, GroupNormalization) and keras.applications'
own models, on the from-scratch path and under ``fit``, exported and served.

In float64, so that any difference is the algorithm's: the from-scratch step equals
``MirroredStrategy``'s ``fit`` even for models with Dropout (every replica draws from the same
seed each step, as Keras' replicas do: docs/your-model.md), and a model's own losses count once
per update on every synchronous path. The mid-epoch resumes of a model with Dropout and Adam are
in tests/test_resume_exactly.py."""

import os

import numpy as np
import pytest
import tensorflow as tf

from same_model import head
from tfdp.config.settings import Config
from tfdp.models import catalog
from tfdp.training import entry
from tfdp.util.errors import UserError

ZOO = os.path.join(os.path.dirname(__file__), "own_models", "zoo.py")


def _run(tmp_path, split, function, strategy, k, **flags):
    name = f"{function}-{strategy}{k}-" + "-".join(f"{a}{b}" for a, b in flags.items())
    settings = dict(model=f"{ZOO}:{function}", batch_size=60, lr=0.05, epochs=2, seed=5,
                    precision="float64", eval_steps=1, workdir=str(tmp_path / name),
                    export_dir=str(tmp_path / f"{name}-export"))
    config = Config(strategy=strategy, num_gpus=k, **{**settings, **flags})
    return entry.train(config, splits=(split, split), export=False)


def _apart(a: list, b: list) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


@pytest.mark.slow
def test_a_models_own_losses_count_once_per_update_on_every_path(tmp_path, train_split):
    """Kernel, bias and activity regularizers and ``add_loss``: the same weights on the
    from-scratch path (1 and 2 devices), under ``fit`` with and without a strategy, and another
    model than without them. (multi_worker: tests/test_multi_worker.py.)"""
    split = head(train_split, 240)  # 4 steps an epoch, shards of 30.
    runs = {key: _run(tmp_path, split, "regularized_cnn", *key)
            for key in (("manual", 1), ("manual", 2), ("mirrored", 2), ("plain", 1))}
    reference = runs["manual", 2]
    for key, result in runs.items():
        assert _apart(result.weights, reference.weights) < 1e-9, key
        # The loss reported is what is minimized: the cross-entropy and the model's losses
        # (fit's mean in its float32 metric).
        assert abs(result.history[0]["loss"] - reference.history[0]["loss"]) < 1e-6, key
    bare = _run(tmp_path, split, "unregularized_cnn", "manual", 2)
    assert _apart(bare.weights, reference.weights) > 1e-3
    assert reference.history[0]["loss"] > bare.history[0]["loss"] + 0.1


@pytest.mark.parametrize("function", ["dropout_cnn", "subclassed", "tiny_vit", "group_norm"])
@pytest.mark.slow
def test_a_keras_guides_model_trains_from_scratch_what_fit_trains(tmp_path, train_split,
                                                                    function):
    """Dropout, SpatialDropout, GaussianNoise and -Dropout, AlphaDropout, RandomFlip;
    BatchNormalization in a subclassed model; LayerNormalization and MultiHeadAttention's own
    dropout; GroupNormalization: the same weights (and seed states) from scratch as under
    ``fit``, both with two replicas."""
    split = head(train_split, 240)
    manual = _run(tmp_path, split, function, "manual", 2)
    fit = _run(tmp_path, split, function, "mirrored", 2)
    assert np.isfinite(manual.history[-1]["loss"])
    assert manual.history[-1]["loss"] != manual.history[0]["loss"]
    assert _apart(manual.weights, fit.weights) < 1e-9
    assert manual.history[-1]["test_acc"] == fit.history[-1]["test_acc"]


def test_the_seed_states_move_and_dropout_draws_other_masks_each_step(tmp_path, train_split):
    """The from-scratch step returns each seed state moved, as Keras moves it: a step count of
    two steps an epoch over two epochs, and the masks differ from step to step (training the
    same batch twice moves the weights differently each time)."""
    model = catalog.build(f"{ZOO}:dropout_cnn", (28, 28, 1), 10, "float64", seed=5)
    from tfdp.models.stateless import KerasModel

    stepped = KerasModel(model)
    assert len(stepped.states) == 6  # RandomFlip, the two noises, and three dropouts.
    values = {**dict(zip(stepped.names, model.get_weights())),
              **dict(zip(stepped.states, stepped.initial_states()))}
    values = {k: tf.constant(v) for k, v in values.items()}
    images = tf.constant(head(train_split, 8).images)
    first, moved, _ = stepped.forward(values, images, training=True)
    again, moved_again, _ = stepped.forward({**values, **moved}, images, training=True)
    for name in stepped.states:
        assert moved[name].numpy()[1] == values[name].numpy()[1] + 1, name
        assert moved_again[name].numpy()[1] == values[name].numpy()[1] + 2, name
    assert np.abs(first.numpy() - again.numpy()).max() > 1e-3
    inference, _, _ = stepped.forward(values, images, training=False)
    np.testing.assert_array_equal(inference.numpy(),
                                  stepped.forward(values, images, training=False)[0].numpy())


@pytest.mark.parametrize("function, said", [
    ("softmax_head", "has a softmax activation: tfdp trains its logits (the layer without it)"),
    ("softmax_layer", "is a softmax: tfdp trains the logits beneath it"),
])
def test_a_softmax_head_is_trained_beneath_and_served_with_its_meaning(
        tmp_path, train_split, function, said, caplog):
    split = head(train_split, 120)
    catalog.SAID.discard(f"{ZOO}:{function}")
    result = entry.train(Config(
        model=f"{ZOO}:{function}", num_gpus=2, batch_size=60, epochs=1, eval_steps=1,
        workdir=str(tmp_path / "run"), export_dir=str(tmp_path / "export")),
        splits=(split, split))
    assert any(said in r.getMessage() for r in caplog.records), caplog.text
    served = tf.saved_model.load(result.export_path).signatures["serving_default"](
        images=tf.constant(split.images[:16]))
    logits, probabilities = served["logits"].numpy(), served["probabilities"].numpy()
    np.testing.assert_allclose(probabilities, tf.nn.softmax(logits).numpy(), rtol=1e-5)
    assert np.abs(logits.sum(axis=-1) - 1).min() > 1e-2  # Logits, not probabilities.
    assert probabilities.max() > 0.25  # Not a softmax of probabilities (at most ~0.23).


def test_a_softmax_tfdp_cannot_see_is_refused_before_training():
    with pytest.raises(UserError, match="the model's outputs are probabilities") as caught:
        catalog.build(f"{ZOO}:hidden_softmax", (28, 28, 1), 10)
    assert "\n" not in str(caught.value)


APPLICATIONS = ["mobilenet_v3_small", "efficientnet_b0", "resnet50_v2"]


@pytest.fixture(scope="module")
def rgb32(tmp_path_factory):
    """32 x 32 colour images in 10 classes, as an .npz of Keras' layout."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("rgb32") / "rgb32.npz"
    np.savez(path, x_train=rng.integers(0, 256, (64, 32, 32, 3), np.uint8),
             y_train=rng.integers(0, 10, 64), x_test=rng.integers(0, 256, (16, 32, 32, 3),
                                                                   np.uint8),
             y_test=rng.integers(0, 10, 16))
    return str(path)


@pytest.mark.slow
@pytest.mark.early
@pytest.mark.parametrize("function", APPLICATIONS)
def test_keras_applications_train_on_both_paths_and_serve(tmp_path, rgb32, function):
    """keras.applications' models (weights=None, their softmax heads on) on 32 x 32 x 3
    images: two steps from scratch and under ``fit``, each exported and served. Eager steps:
    tracing these graphs costs tens of seconds a model, and the compiled step is the same code
    (the models above train it)."""
    served = {}
    for strategy in ("manual", "mirrored"):
        exported = strategy == "manual" or function == APPLICATIONS[0]
        result = entry.train(Config(
            strategy=strategy, model=f"{ZOO}:{function}", dataset=f"npz:{rgb32}", num_gpus=2,
            batch_size=16, lr=0.01, epochs=1, steps_per_epoch=2, eager=True,
            data_dir=str(tmp_path / "data"), workdir=str(tmp_path / strategy),
            export_dir=str(tmp_path / f"{strategy}-export")), export=exported)
        assert np.isfinite(result.history[-1]["loss"]), strategy
        if exported:
            out = tf.saved_model.load(result.export_path).signatures["serving_default"](
                images=tf.zeros([2, 32, 32, 3], tf.uint8))
            served[strategy] = out
            np.testing.assert_allclose(out["probabilities"].numpy(),
                                       tf.nn.softmax(out["logits"]).numpy(), rtol=1e-4)
            assert out["logits"].shape == (2, 10)
    assert served
