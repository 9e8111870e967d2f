"""``python -m tfdp.predict``: your images classified by an export, by class name, in order,
fitted as the training fitted its data, a damaged file one line that stops nothing."""

import csv
import io
import json
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfdp
from conftest import REPO
from processes import child_env
from terminal import Terminal
from tfdp.data.image_folder import fit
from tfdp.predict import formatted, predict


@pytest.fixture(scope="module")
def exported(tmp_path_factory, data_dir):
    """A short run's export folder (Fashion-MNIST's class names)."""
    folder = tmp_path_factory.mktemp("predict")
    result = tfdp.run(epochs=1, steps_per_epoch=3, eval_steps=1, batch_size=32, data_dir=data_dir,
                      workdir=str(folder / "run"), export_dir=str(folder / "export"))
    return folder / "export", result


def write_images(folder, test_split):
    """Three test images as PNGs (one in a subfolder), one as a wide RGB JPEG, a damaged file,
    and an .npz of two: [(name, the image as the export sees it)] in the order given back."""
    from PIL import Image

    images = np.asarray(test_split.images[:6])
    (folder / "b").mkdir(parents=True)
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "0.png").write_bytes(b"skipped")
    names = [folder / "0.png", folder / "1.png", folder / "b" / "2.png"]
    for name, image in zip(names, images):
        Image.fromarray(image[..., 0]).save(name)
    wide = Image.fromarray(np.repeat(images[3], 3, -1)).resize((56, 40))
    wide.save(folder / "b" / "3.jpg", quality=95)
    (folder / "b" / "4.png").write_bytes(b"not a png")
    np.savez(folder.parent / "two.npz", x_test=images[4:6])
    with Image.open(folder / "b" / "3.jpg") as image:
        seen_wide = fit(image, (28, 28, 1))
    expected = [(str(n), i) for n, i in zip(names, images)] + [
        (str(folder / "b" / "3.jpg"), seen_wide), (str(folder / "b" / "4.png"), None),
        (f"{folder.parent / 'two.npz'}[0]", images[4]), (f"{folder.parent / 'two.npz'}[1]",
                                                         images[5])]
    return expected


def test_predictions_by_class_name_are_the_exports_own_in_order(tmp_path, exported, test_split):
    export, result = exported
    expected = write_images(tmp_path / "pics", test_split)
    found = predict(str(export), [str(tmp_path / "pics"), str(tmp_path / "two.npz")], top=3,
                    batch_size=2)
    assert [p.name for p in found] == [name for name, _ in expected]
    damaged = [p for p in found if p.error]
    assert [p.name for p in damaged] == [str(tmp_path / "pics" / "b" / "4.png")]
    assert damaged[0].error.startswith("not an image PIL can read (UnidentifiedImageError")
    serve = tf.saved_model.load(str(export / "1")).signatures["serving_default"]
    images = np.stack([image for _, image in expected if image is not None])
    probabilities = serve(images=tf.constant(images))["probabilities"].numpy()
    names = [line.strip() for line in open(export / "1" / "assets" / "labels.txt")]
    for p, row in zip([p for p in found if not p.error], probabilities):
        best = np.argsort(-row, kind="stable")[:3]
        assert p.classes == tuple(names[k] for k in best)
        assert np.allclose(p.probabilities, row[best], atol=1e-6)
        assert p.probabilities[0] >= p.probabilities[1] >= p.probabilities[2]
    as_json = json.loads(formatted(found[:2], "json"))
    assert as_json[0]["image"] == found[0].name and len(as_json[0]["top"]) == 3
    assert as_json[1]["top"][0]["class"] == found[1].classes[0]


def test_the_command_writes_csv_and_names_what_it_skipped(tmp_path, exported, test_split):
    export, _ = exported
    write_images(tmp_path / "pics", test_split)
    # Standard error a terminal (its progress line), standard output a file, as a user types it.
    out = tmp_path / "predictions.csv"
    done = Terminal(["bash", "-c", f"{shlex.quote(sys.executable)} -m tfdp.predict "
                     f"{export} {tmp_path / 'pics'} --format=csv --top=2 > {out}"])
    assert done.finish(120) == 1, done.text[-2000:]  # One file skipped: the others printed.
    damaged = tmp_path / "pics" / "b" / "4.png"
    lines = done.text.replace("\r\n", "\n").strip().splitlines()
    assert lines[-1] == (
        f"tfdp.predict: skipped {damaged}: not an image PIL can read (UnidentifiedImageError: "
        f"cannot identify image file '{damaged}')")
    # Redrawn in place (splitlines splits at its carriage returns), the rate on the last.
    assert lines[-3] == "predicting: 0 of 5 images", lines
    assert re.fullmatch(r"predicting: 5 of 5 images in \d+\.\d s \([\d,]+ images/s\)",
                        lines[-2]), lines
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["image"] for r in rows] == [str(tmp_path / "pics" / n) for n in
                                          ("0.png", "1.png", "b/2.png", "b/3.jpg")]
    assert list(rows[0]) == ["image", "class_1", "probability_1", "class_2", "probability_2"]
    names = {line.strip() for line in open(export / "1" / "assets" / "labels.txt")}
    assert all(r["class_1"] in names and float(r["probability_1"]) >= float(r["probability_2"])
               for r in rows)
    missing = subprocess.run([sys.executable, "-m", "tfdp.predict", str(tmp_path),
                              str(tmp_path / "pics")], capture_output=True, text=True,
                             env=child_env(), cwd=REPO, timeout=120)
    assert missing.returncode == 1 and missing.stderr.strip().endswith(
        f"tfdp.predict: error: {tmp_path} is no export: give a folder tfdp.train exported into "
        "(saved_models/lenet) or one of its versions (saved_models/lenet/1)"), missing.stderr
