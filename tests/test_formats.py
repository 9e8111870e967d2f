"""--export_formats and python -m tfdp.export: ONNX and LiteRT files inside the version, written
with it or not at all; a bad name or a missing converter is one line before training."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from processes import AS_FROM_A_SHELL, child_env, run_module
from tfdp.config.settings import Config
from tfdp.export import formats
from tfdp.export import saved_model
from tfdp.models import lenet
from tfdp.util.errors import UserError


def test_a_bad_format_or_a_missing_converter_is_one_line(monkeypatch):
    with pytest.raises(UserError, match=r"^--export_formats=saved_model,pdf: give a "
                                        r"comma-separated list of saved_model, onnx, litert$"):
        Config(export_formats="saved_model,pdf")
    assert Config(export_formats="litert,onnx").export_formats == "saved_model,litert,onnx"
    monkeypatch.setattr(formats, "_importable", lambda module: module != "tf2onnx")
    with pytest.raises(UserError, match=r"^--export_formats: onnx needs tf2onnx, which is not "
                                        r"installed: pip install 'tfdp\[onnx\]'$"):
        Config(export_formats="onnx")


def test_tfdp_train_refuses_a_bad_format_before_training(tmp_path):
    result = run_module("tfdp.train", "--export_formats=onnx,bogus", "--epochs=1",
                        f"--workdir={tmp_path / 'run'}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "tfdp.train: error: --export_formats=onnx,bogus: give a comma-separated list of "
        "saved_model, onnx, litert")
    assert not (tmp_path / "run").exists()


def test_a_failed_conversion_publishes_no_version(tmp_path, monkeypatch):
    def fails(saved_model, path):
        raise UserError("converter broke")

    monkeypatch.setattr(formats, "_to_onnx", fails)
    model = lenet.serving_model(lenet.start_params("glorot", 0), "float32")
    with pytest.raises(UserError, match="converter broke"):
        saved_model.export(model, str(tmp_path), "saved_model,onnx")
    assert os.listdir(tmp_path) == []  # No version, no temporary folder.


@pytest.mark.slow
def test_tfdp_export_adds_the_formats_to_an_earlier_version(tmp_path):
    model = lenet.serving_model(lenet.start_params("glorot", 0), "float32")
    version = saved_model.export(model, str(tmp_path / "exp"))
    assert not os.path.exists(os.path.join(version, "model.onnx"))
    done = subprocess.run([sys.executable, "-m", "tfdp.export", version,
                           "--formats=onnx,litert"], capture_output=True, text=True,
                          env=child_env(**AS_FROM_A_SHELL), cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""  # Not TensorFlow's start-up banners, nor the converter's chatter.
    assert done.stdout.splitlines() == [f"tfdp.export: wrote {version}/model.onnx",
                                        f"tfdp.export: wrote {version}/model.tflite"]
    import onnxruntime

    images = np.random.RandomState(0).randint(0, 256, (5, 28, 28, 1)).astype(np.uint8)
    session = onnxruntime.InferenceSession(os.path.join(version, "model.onnx"))
    names = [o.name for o in session.get_outputs()]
    classes = dict(zip(names, session.run(None, {"images": images})))["classes"]
    import tensorflow as tf

    served = tf.saved_model.load(version).signatures["serving_default"](
        images=tf.constant(images))["classes"].numpy()
    np.testing.assert_array_equal(classes, served)
    missing = subprocess.run([sys.executable, "-m", "tfdp.export", str(tmp_path)],
                             capture_output=True, text=True, env=child_env(), cwd=REPO,
                             timeout=300)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines()[-1] == (
        f"tfdp.export: error: {tmp_path} holds no saved_model.pb: give a version folder that "
        "tfdp.train exported")
