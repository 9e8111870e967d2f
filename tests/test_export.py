"""Exports are versioned and atomic: a new version each time, nothing half-written, ever."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tfdp.export import saved_model
from tfdp.models import lenet
from tfdp.util.errors import UserError


def module():
    return lenet.serving_model(lenet.init_params(0))


def test_versions_count_up_and_serve(tmp_path):
    root = str(tmp_path / "exp")
    first = saved_model.export(module(), root)
    second = saved_model.export(module(), root)
    assert first.endswith(os.path.join("exp", "1")) and second.endswith(os.path.join("exp", "2"))
    assert sorted(os.listdir(root)) == ["1", "2"]  # No temporary folders left behind.
    serve = tf.saved_model.load(second).signatures["serving_default"]
    out = serve(images=tf.zeros([3, 28, 28, 1], tf.uint8))
    assert out["logits"].shape == (3, 10) and out["classes"].dtype == tf.int64
    np.testing.assert_allclose(out["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-6)


def test_the_class_names_travel_with_the_model_as_labels_txt_and_a_signature(tmp_path):
    """In class order: the asset ``labels.txt`` (one a line) that a client reads from the
    version's folder, the ``labels`` signature for TF2's loader, and the same signature as
    TensorFlow's own ``saved_model_cli`` shows it to a serving client."""
    import subprocess
    import sys

    names = ["T-shirt/top", "Trouser", "Pull over", "Dress", "Coat", "Sandal", "Shirt",
             "Sneaker", "Bag", "Ankle boot"]
    version = saved_model.export(module(), str(tmp_path / "exp"), class_names=names)
    with open(os.path.join(version, "assets", "labels.txt"), encoding="utf-8") as f:
        assert f.read().splitlines() == names
    loaded = tf.saved_model.load(version)
    assert [n.decode() for n in loaded.signatures["labels"]()["class_names"].numpy()] == names
    shown = subprocess.run([sys.executable, "-m", "tensorflow.python.tools.saved_model_cli",
                            "show", "--dir", version, "--tag_set", "serve", "--signature_def",
                            "labels"], capture_output=True, text=True, timeout=120)
    assert "outputs['class_names'] tensor_info:" in shown.stdout, shown.stderr[-2000:]
    assert "dtype: DT_STRING" in shown.stdout and "shape: (10)" in shown.stdout, shown.stdout


def test_failed_save_leaves_earlier_versions_alone(tmp_path, monkeypatch):
    root = str(tmp_path / "exp")
    saved_model.export(module(), root)
    before = sorted(os.listdir(os.path.join(root, "1")))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", crash)
    with pytest.raises(OSError):
        saved_model.export(module(), root)
    assert os.listdir(root) == ["1"]
    assert sorted(os.listdir(os.path.join(root, "1"))) == before


def test_export_root_that_is_a_file_or_unwritable(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        saved_model.check_export_root(str(a_file))
    with pytest.raises(UserError, match="not writable"):
        saved_model.check_export_root(str(a_file / "below"))
