"""Nothing bad is exported: a loss that runs away or stops being finite ends the run at its
step on every path, and starting weights that cannot be LeNet's are refused in one line."""

import os
import re
import subprocess

import numpy as np
import pytest

from conftest import REPO
from processes import child_env, train_command
from tfdp.config.settings import Config
from tfdp.models import lenet
from tfdp.training import divergence, entry
from tfdp.util.errors import Diverged, UserError


@pytest.mark.parametrize("strategy", ["manual", "mirrored"])
@pytest.mark.slow
def test_a_runaway_loss_stops_the_run_and_exports_nothing(tmp_path, data_dir, strategy):
    """--lr=50: the loss runs away (finite under mirrored: 2.1e29 as an epoch's mean, the model
    at chance), and the run stops within the first steps, naming the step, exporting nothing."""
    result = subprocess.run(
        train_command(data_dir, tmp_path, f"--strategy={strategy}", "--num_gpus=2", "--lr=50",
                      "--epochs=3", "--steps_per_epoch=30", "--eval_steps=1"),
        capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=300)
    assert result.returncode == 1
    at = "at" if strategy == "manual" else "by"
    assert re.search(rf"^tfdp\.train: error: the training loss is \S+ {at} epoch 1, step \d+/30(, "
                     r"over 100 times its first value and chance's \(2\.\d\d\))?: training "
                     r"diverged, nothing was exported; try a smaller --lr$",
                     result.stderr, re.M), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "export").exists() or not os.listdir(tmp_path / "export")


def test_divergence_is_a_non_finite_or_exploded_loss_and_never_a_healthy_one():
    watch = divergence.Divergence()
    for step, loss in enumerate([2.31, 2.9, 1.2, 0.4, 229.0], start=1):  # Noisy, not exploded.
        watch.check(loss, step, 235)
    with pytest.raises(Diverged, match=r"the training loss is 232 at epoch 1, step 6/235, over "
                                       r"100 times its first value and chance's \(2\.31\)"):
        watch.check(232.0, 6, 235)
    with pytest.raises(Diverged, match=r"the training loss is nan at epoch 2, step 1/235: "):
        divergence.Divergence().check(float("nan"), 236, 235)
    resumed = divergence.Divergence()  # A trained model's first loss: chance still sets the bar.
    resumed.check(0.3, 1000, 235)
    resumed.check(200.0, 1001, 235)
    with pytest.raises(Diverged, match=r"by epoch 5, step 60/235, over 100 times .* \(2\.30\)"):
        resumed.check(231.0, 1000, 235, exact=False)


def test_keras_path_stops_at_a_non_finite_loss_too(tmp_path, data_dir):
    config = Config(strategy="mirrored", num_gpus=2, lr=1000.0, epochs=2, steps_per_epoch=30,
                    eval_steps=1, data_dir=data_dir, workdir=str(tmp_path / "run"),
                    export_dir=str(tmp_path / "export"))
    with pytest.raises(Diverged, match=r"by epoch 1, step \d+/30: training diverged"):
        entry.train(config)
    assert not (tmp_path / "export").exists() or not os.listdir(tmp_path / "export")


def write_init(path, **changes):
    params = dict(lenet.init_params(0), **changes)
    np.savez(path, **params)
    return str(path)


def test_init_files_that_cannot_be_lenet_are_refused_in_one_line(tmp_path):
    nan = lenet.init_params(0)["W2"].copy()
    nan[0, 0, 0, 0] = np.nan
    cases = {
        write_init(tmp_path / "nan.npz", W2=nan): "W2 holds NaN or infinite values",
        str(tmp_path / "text.npz"): "not a zip archive",
        str(tmp_path / "array.npz"): "a single .npy array renamed",
        str(tmp_path / "partial.npz"): "it lacks b3, W4",
    }
    (tmp_path / "text.npz").write_text("W1 = 0.1\n")
    np.save(tmp_path / "array.npy", np.zeros(3))
    os.rename(tmp_path / "array.npy", tmp_path / "array.npz")
    partial = lenet.init_params(0)
    del partial["b3"], partial["W4"]
    np.savez(tmp_path / "partial.npz", **partial)
    for path, message in cases.items():
        with pytest.raises(UserError, match=re.escape(message)) as caught:
            lenet.start_params(path, 0)
        assert str(caught.value).startswith(f"--init={path}")
        assert "\n" not in str(caught.value)
