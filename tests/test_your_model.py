"""Your own Keras model (``--model=FILE:function``, ``tfdp.run(model=function)``) on the paths:
the from-scratch step through ``stateless_call`` trains the same weights on 1, 2 and 4 devices
as Keras ``fit`` under ``MirroredStrategy`` does (float64), and a model that cannot be trained
is refused in one line."""

import os

import numpy as np
import pytest

from same_model import head
from tfdp.config import model_spec
from tfdp.config.settings import Config
from tfdp.models import catalog
from tfdp.training import entry
from tfdp.util.errors import UserError

OWN = os.path.join(os.path.dirname(__file__), "own_models", "residual_cnn.py")


def _settings(tmp_path, name, **overrides):
    return dict(dict(model=f"{OWN}:residual_cnn", batch_size=60, lr=0.05, momentum=0.9,
                     epochs=2, seed=5, precision="float64", eval_steps=1,
                     workdir=str(tmp_path / name), export_dir=str(tmp_path / f"{name}-exp")),
                **overrides)


def _moved_apart(a: list, b: list, start: list) -> float:
    """|a - b| over how far training moved ``a`` from ``start``, the largest of any weight."""
    return max(np.abs(x - y).max() / max(np.abs(x - s).max(), 1e-30)
               for x, y, s in zip(a, b, start))


def _train(tmp_path, split, function, strategy, k):
    config = Config(strategy=strategy, num_gpus=k,
                    **_settings(tmp_path, f"{function}-{strategy}{k}",
                                model=f"{OWN}:{function}"))
    return entry.train(config, splits=(split, split), export=False)


@pytest.mark.slow
def test_your_model_trains_the_same_weights_on_every_device_count_and_under_fit(
        tmp_path, train_split):
    """Float64, so any difference is the algorithm's. Without batch normalization every
    device count trains the same weights, on the from-scratch path and under ``fit``."""
    split = head(train_split, 240)  # 4 steps an epoch; shards of 60, 30 and 15.
    start = catalog.build(f"{OWN}:residual_cnn_without_norm", (28, 28, 1), 10, "float64",
                          seed=5).get_weights()
    runs = {(strategy, k): _train(tmp_path, split, "residual_cnn_without_norm", strategy, k)
            for strategy, k in (("manual", 1), ("manual", 2), ("manual", 4), ("mirrored", 2))}
    reference = runs["manual", 1]
    assert reference.history[-1]["loss"] < reference.history[0]["loss"]
    for key, result in runs.items():
        assert _moved_apart(result.weights, reference.weights, start) < 1e-9, key
        assert result.history[-1]["test_acc"] == reference.history[-1]["test_acc"], key


@pytest.mark.slow
def test_your_batch_normalized_model_trains_under_fit_what_it_trains_from_scratch(
        tmp_path, train_split):
    """With batch normalization each replica normalizes its own shard (on both paths, as
    Keras does), so each device count is a model of its own: the from-scratch path and
    ``fit`` agree on each, running statistics included."""
    split = head(train_split, 240)
    start = catalog.build(f"{OWN}:residual_cnn", (28, 28, 1), 10, "float64",
                          seed=5).get_weights()
    model = catalog.build(f"{OWN}:residual_cnn", (28, 28, 1), 10)
    statistics = [i for i, v in enumerate(model.weights) if not v.trainable]
    assert statistics  # Batch normalization's moving mean and variance.
    one = None
    for k in (1, 2):
        manual = _train(tmp_path, split, "residual_cnn", "manual", k)
        fit = _train(tmp_path, split, "residual_cnn", "mirrored", k)
        assert _moved_apart(fit.weights, manual.weights, start) < 1e-9, k
        assert fit.history[-1]["test_acc"] == manual.history[-1]["test_acc"], k
        one = one or manual
        if k > 1:  # Statistics of shards, not of the whole batch: another model.
            assert any(np.abs(manual.weights[i] - one.weights[i]).max() > 1e-6
                       for i in statistics)


@pytest.mark.slow
def test_resnet18_trains_from_scratch(tmp_path, train_split):
    """Refused on the from-scratch path before it took any Keras model: 11 million weights
    through ``stateless_call``, its batch-norm statistics moved on both replicas alike."""
    split = head(train_split, 32)
    result = entry.train(Config(**_settings(
        tmp_path, "resnet18", model="resnet18", precision="float32", epochs=1, batch_size=16,
        num_gpus=2, momentum=0.0)), splits=(split, split), export=False)
    assert len(result.weights) == len(catalog.build("resnet18", (28, 28, 1), 10).weights)
    assert np.isfinite(result.history[-1]["loss"])


def test_a_subclassed_model_is_called_on_an_input_of_the_data(tmp_path, train_split):
    split = head(train_split, 64)
    result = entry.train(Config(**_settings(
        tmp_path, "sub", model=f"{OWN}:subclassed", precision="float32", epochs=1,
        batch_size=32, num_gpus=2)), splits=(split, split), export=False)
    assert np.isfinite(result.history[-1]["loss"])
    assert result.final_line


@pytest.mark.parametrize("spec, message", [
    ("nothing", "--model=nothing: give lenet, lenet_bn, resnet18, package.module:function or "
                "path/to/file.py:function"),
    ("no/such/file.py:f", "--model=no/such/file.py:f: there is no file no/such/file.py"),
    (f"{OWN}:missing", f"--model={OWN}:missing: {OWN} has no missing"),
    ("no_such_module_here:f", "--model=no_such_module_here:f: cannot import "
                              "no_such_module_here (ModuleNotFoundError"),
    (f"{OWN}:not_a_model", "the function returned a str, not a Keras model"),
    (f"{OWN}:wrong_classes", "the model gives outputs of shape (11,) for images of shape "
                             "(28, 28, 1); tfdp needs (10,): one logit per class"),
])
def test_a_model_tfdp_cannot_train_is_named_in_one_line(spec, message):
    with pytest.raises(UserError) as caught:
        Config(model=spec)  # The form: when the config is made.
        catalog.build(spec, (28, 28, 1), 10)  # The rest: when the model is made.
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_init_is_lenets_and_the_run_folder_is_named_after_your_function():
    with pytest.raises(UserError, match="--init=textbook starts LeNet"):
        Config(model=f"{OWN}:residual_cnn", init="textbook")
    assert Config(model=f"{OWN}:residual_cnn").export_root == os.path.join(
        "saved_models", "residual_cnn")


def test_a_function_given_to_tfdp_run_is_found_by_its_spec():
    from own_models import residual_cnn

    spec = model_spec.spec_of(residual_cnn.residual_cnn)
    assert spec == "own_models.residual_cnn:residual_cnn"
    assert catalog.function_of(spec) is residual_cnn.residual_cnn

    def local(input_shape, num_classes):  # No import reaches it: kept in this process.
        return residual_cnn.residual_cnn(input_shape, num_classes)

    assert catalog.function_of(model_spec.spec_of(local)) is local


def test_your_model_takes_bfloat16_accumulation_and_a_trace(tmp_path, data_dir):
    """The run's other choices apply to your model as to LeNet, from scratch: bfloat16 (its
    layers under Keras' mixed policy), updates accumulated from two micro-batches, and the
    traced steps' timeline with each replica's forward and backward pass."""
    import json

    from traces import lanes_by_step

    result = entry.train(Config(
        strategy="manual", num_gpus=2, model=f"{OWN}:residual_cnn_without_norm",
        precision="bfloat16", accumulate_steps=2, trace_steps="2:3", batch_size=64, lr=0.05,
        epochs=1, steps_per_epoch=4, eval_steps=1, data_dir=data_dir,
        workdir=str(tmp_path / "run"), export_dir=str(tmp_path / "export")))
    assert np.isfinite(result.history[-1]["loss"]) and result.export_path
    found = lanes_by_step(json.loads((tmp_path / "run" / "timeline.json").read_text()))
    for step in (2, 3):
        for replica in (0, 1):
            assert {"forward", "backward"} <= found[("chief", f"replica {replica}", step)]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["config"]["precision"] == "bfloat16"


def test_tfdp_run_takes_a_keras_model_instance_whose_weights_start_the_run(tmp_path, data_dir):
    """The instance is copied where the run builds its model (under a strategy too): the copy
    starts from its weights, and the instance itself is left as it was, softmax and all."""
    import tfdp
    from own_models import zoo

    instance = zoo.softmax_head((28, 28, 1), 10)
    start = [w.copy() for w in instance.get_weights()]
    for strategy in ("manual", "mirrored"):
        result = tfdp.run(model=instance, strategy=strategy, num_gpus=2, lr=1e-12, epochs=1,
                          steps_per_epoch=1, batch_size=32, eval_steps=1, data_dir=data_dir,
                          workdir=str(tmp_path / strategy), export_dir=str(tmp_path / "export"))
        assert max(np.abs(a - b).max() for a, b in zip(result.weights, start)) < 1e-9, strategy
    assert all((a == b).all() for a, b in zip(instance.get_weights(), start))
    assert instance.layers[-1].activation.__name__ == "softmax"
    assert os.path.basename(os.path.dirname(result.export_path)) == "export"


def test_a_model_instance_tfdp_cannot_copy_or_retype_is_refused_in_one_line(data_dir):
    import tfdp
    from own_models import zoo

    for model, precision, message in [
            (zoo.subclassed((28, 28, 1), 10), "float32",
             "Keras cannot copy this model instance (keras.models.clone_model raised "
             "NotImplementedError; a subclassed model is copied only through its get_config): "
             "give tfdp.run the function that builds it instead"),
            (zoo.group_norm((28, 28, 1), 10), "float64",
             "a model instance trains in the dtype policy it was built in (float32), not "
             "--precision's (float64)")]:
        with pytest.raises(UserError) as caught:
            tfdp.run(model=model, precision=precision, epochs=1, steps_per_epoch=1,
                     data_dir=data_dir)
        assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_function_of_another_form_or_that_raises_is_named_with_the_users_frames_only():
    def no_arguments():
        return None

    with pytest.raises(UserError) as caught:
        catalog.build(model_spec.spec_of(no_arguments), (28, 28, 1), 10)
    assert ("no_arguments() cannot be called as function(input_shape, num_classes)"
            in str(caught.value)) and "\n" not in str(caught.value)

    def raises(input_shape, num_classes):
        import keras

        return keras.layers.Dense(num_classes)(keras.Input((None,)), mask="not a mask")

    with pytest.raises(UserError) as caught:
        catalog.build(model_spec.spec_of(raises), (28, 28, 1), 10)
    first, *frames = str(caught.value).splitlines()
    assert "raises((28, 28, 1), 10) raised " in first, first
    assert frames and all(__file__ in line or not line.startswith("  File") for line in frames)
    assert any("in raises" in line for line in frames), frames
