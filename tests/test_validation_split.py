"""A validation split (``--validation_split``, docs/your-data.md): Keras' one-folder layout holds
out a share of each class by seed; every path trains the same model with a split, evaluates
the validation split after every epoch and the test set once, and counts the same confusion
matrix."""

import os

import numpy as np
import pytest

from image_folders import write_folder
from tfdp.data import sources
from tfdp.util.errors import UserError


def one_folder(root, split, per_class):
    """``per_class[k]`` of ``split``'s class-``k`` images in ``root/<class name>/*`` (Keras'
    one-folder layout), beside a .ipynb_checkpoints folder."""
    rows = np.concatenate([np.flatnonzero(split.labels == k)[:n] for k, n in enumerate(per_class)])
    write_folder(root, np.asarray(split.images)[rows], np.asarray(split.labels)[rows],
                 [f"class {k}" for k in range(len(per_class))], ".")
    (root / ".ipynb_checkpoints").mkdir()
    return rows


def test_one_folder_of_classes_holds_out_a_share_of_each_class_by_seed(tmp_path, train_split):
    """ROOT/<class>/* as Keras users keep it: no test set, so 0.2 of each class is held out
    unless --validation_split says otherwise; the same examples on every call, others with
    another seed; kept and held out together are the folder's images, each once."""
    from tfdp.data import pipeline

    root = tmp_path / "flowers"
    rows = one_folder(root, train_split, (10, 5, 1))
    data = str(tmp_path / "data")
    info = sources.prepare(f"folder:{root}", data)
    assert info.examples == {"train": 13, "validation": 3} and info.evaluated == "validation"
    assert info.tested is None and info.validation == {"split": 0.2, "seed": 0}
    kept, held = (pipeline.load(info, split) for split in ("train", "validation"))
    # round(0.2 x n) of each class, n - 1 at most: 2 of 10, 1 of 5, none of the lone image.
    assert np.bincount(held.labels, minlength=3).tolist() == [2, 1, 0]
    images = lambda split: sorted(x.tobytes() for x in np.asarray(split.images))  # noqa: E731
    written = sorted(x.tobytes() for x in np.asarray(train_split.images)[rows])
    assert sorted(images(kept) + images(held)) == written and len(set(written)) == 16
    sources.prepare.cache_clear()  # As a new process would: the same examples.
    again = sources.prepare(f"folder:{root}", data)
    assert again.folder == info.folder
    assert images(pipeline.load(again, "validation")) == images(held)
    other = sources.prepare(f"folder:{root}", data, seed=1)
    assert images(pipeline.load(other, "validation")) != images(held)
    with pytest.raises(UserError, match=r"has no test set \(ROOT/<class>/\*\): give "
                                        r"--validation_split above 0"):
        sources.prepare(f"folder:{root}", data, validation_split=0.0)


def test_with_a_validation_split_every_path_trains_the_same_model_and_tests_once(
        tmp_path, train_split, test_split, capsys):
    """Float64 from equal weights, from scratch and under tf.distribute: the validation split
    evaluated after every epoch, the test set once after training, the same figures and the
    same confusion matrix; the lines, metrics.json and the Result say which is which."""
    import json

    from same_model import comparable_start
    from tfdp.config.settings import Config
    from tfdp.models import lenet
    from tfdp.training import entry

    root = tmp_path / "folder"
    for part, split, count in (("train", train_split, 10), ("test", test_split, 3)):
        rows = np.concatenate([np.flatnonzero(split.labels == k)[:count] for k in range(10)])
        write_folder(root, np.asarray(split.images)[rows], np.asarray(split.labels)[rows],
                     [f"class {k}" for k in range(10)], part)
    start = lenet.to_keras_weights(comparable_start(5, np.float64))
    results = {}
    for strategy in ("manual", "mirrored"):
        config = Config(strategy=strategy, num_gpus=2, precision="float64", epochs=2,
                        batch_size=20, lr=0.1, validation_split=0.3, dataset=f"folder:{root}",
                        data_dir=str(tmp_path / "data"), workdir=str(tmp_path / strategy),
                        plots=strategy == "mirrored")
        results[strategy] = entry.train(config, start, export=False)
    out = capsys.readouterr().out
    manual, mirrored = results["manual"], results["mirrored"]
    assert max(np.abs(a - b).max() for a, b in zip(manual.weights, mirrored.weights)) < 1e-9
    assert manual.validation_accuracy == mirrored.validation_accuracy == \
        manual.history[-1]["test_acc"]
    assert manual.test_accuracy == mirrored.test_accuracy
    assert out.count("epoch 2/2: loss") == 2 and ", val_loss " in out and "test_loss" not in out
    assert out.count("test set, evaluated once after training: loss ") == 2
    assert f"test acc: {manual.test_accuracy:.2f}, " in manual.final_line
    metrics = json.loads((tmp_path / "mirrored" / "metrics.json").read_text())
    assert metrics["evaluated"] == "validation"
    assert metrics["test"]["acc"] == mirrored.test_accuracy
    assert metrics["config"]["validation_split"] == 0.3
    plan = manual.plan  # 3 of each class's 10 held out; the test set's 30, all evaluated.
    assert (plan.train_examples, plan.split_examples, plan.tested) == (70, 30, 30)
    # Where the final evaluation (the test set's) goes wrong: counted by each path's own
    # evaluation step, the same on both.
    confusion = metrics["confusion"]
    manual_confusion = json.loads((tmp_path / "manual" / "metrics.json").read_text())["confusion"]
    assert confusion == manual_confusion and confusion["split"] == "test"
    counts = np.array(confusion["counts"])
    assert counts.shape == (10, 10) and counts.sum(axis=1).tolist() == [3] * 10
    assert np.trace(counts) / 30 == mirrored.test_accuracy
    assert confusion["class_names"] == [f"class {k}" for k in range(10)]
    assert confusion["per_class_accuracy"] == [counts[k, k] / 3 for k in range(10)]
    assert (tmp_path / "mirrored" / "confusion.png").stat().st_size > 1000
    # --plots=false: the same numbers in metrics.json, no chart drawn.
    assert not list((tmp_path / "manual").glob("*.png")), os.listdir(tmp_path / "manual")
