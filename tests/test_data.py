"""The input pipeline: damaged manual files are named, and batches depend on (seed, epoch) only."""

import os
import shutil

import numpy as np
import pytest

from same_model import head
from tfdp.config import plan
from tfdp.data import array_cache, fashion_mnist, pipeline, sources, tfds
from tfdp.paths.keras import distributed_input as sharding
from tfdp.util.errors import UserError


def copy_manual_dir(manual_dir, tmp_path):
    target = tmp_path / "manual"
    target.mkdir()
    for name in fashion_mnist.MANUAL_FILES:
        os.symlink(os.path.join(manual_dir, name), target / name)
    return target


def test_missing_manual_file_is_named(manual_dir, tmp_path):
    target = copy_manual_dir(manual_dir, tmp_path)
    os.remove(target / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(UserError, match="t10k-labels-idx1-ubyte.gz is missing"):
        tfds.prepare(fashion_mnist.DATASET, str(tmp_path / "tfds"), str(target))


def test_damaged_manual_file_is_named(manual_dir, tmp_path):
    target = copy_manual_dir(manual_dir, tmp_path)
    damaged = target / "train-labels-idx1-ubyte.gz"
    os.remove(damaged)
    shutil.copyfile(os.path.join(manual_dir, damaged.name), damaged)  # Writable, whatever
    # the shared file's mode (read-only there: root writes anyway, a user may not).
    with open(damaged, "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(UserError, match="train-labels-idx1-ubyte.gz is damaged"):
        tfds.prepare(fashion_mnist.DATASET, str(tmp_path / "tfds"), str(target))


def test_the_shared_manual_folder_is_looked_for_beside_the_checkout():
    from conftest import REPO

    assert os.path.normpath(fashion_mnist._SHARED_MANUAL_DIR) == os.path.normpath(
        os.path.join(REPO, "..", "shared", "data", "fashion_mnist"))


def test_splits_have_the_real_shapes(train_split, test_split):
    assert train_split.images.shape == (60000, 28, 28, 1)
    assert test_split.images.shape == (10000, 28, 28, 1)
    assert train_split.images.dtype == np.uint8 and train_split.labels.dtype == np.int64
    assert np.bincount(test_split.labels).tolist() == [1000] * 10


def test_the_exported_class_names_are_tfds_label_names(data_dir):
    from tfdp.data import fashion_mnist

    builder = tfds.prepare(fashion_mnist.DATASET, data_dir, None)
    assert tuple(builder.info.features["label"].names) == fashion_mnist.LABEL_NAMES


def test_train_batches_depend_on_seed_and_epoch_only(train_split):
    split = head(train_split, 1000)
    run = [b[1].numpy() for b in pipeline.train_batches(split, 300, seed=5, first_epoch=0, epochs=2,
                                                     steps=4)]
    resumed = [b[1].numpy() for b in pipeline.train_batches(split, 300, seed=5, first_epoch=1,
                                                         epochs=2, steps=4)]
    assert [len(b) for b in run] == [300, 300, 300, 100] * 2  # Short final batch kept.
    for a, b in zip(run[4:], resumed):  # A resumed run sees epoch 1 exactly as before.
        np.testing.assert_array_equal(a, b)
    assert np.array_equal(np.sort(np.concatenate(run[:4])), np.sort(split.labels))
    assert not np.array_equal(run[0], run[4])  # Reshuffled each epoch.
    capped = list(pipeline.train_batches(split, 300, seed=5, first_epoch=0, epochs=2, steps=2))
    assert len(capped) == 4
    np.testing.assert_array_equal(capped[2][1].numpy(), run[4])  # The cap ends the epoch.


def test_eval_batches_cover_the_test_set(test_split):
    assert sum(len(y) for _, y in pipeline.eval_batches(test_split, 256)) == 10000
    assert plan.eval_examples(10000, 256, 3) == 768
    assert sum(len(y) for _, y in pipeline.eval_batches(test_split, 256, steps_cap=3)) == 768


def test_per_replica_shards_and_weights_cover_each_batch_once(train_split):
    """Batches of 7 and a last one of 2 over 3 replicas: 3 + 2 + 2, then 1 + 1 + 0."""
    batches = pipeline.train_batches(head(train_split, 16), 7, seed=0, first_epoch=0, epochs=1,
                                 steps=3)
    shards = list(sharding.per_replica_batches(batches, 3, first=0, count=3))
    assert [len(y) for _, y, _ in shards] == [3, 2, 2, 3, 2, 2, 1, 1, 0]
    for step, (images, labels) in enumerate(batches):
        own = shards[3 * step: 3 * step + 3]
        np.testing.assert_array_equal(np.concatenate([y for _, y, _ in own]), labels)
        np.testing.assert_array_equal(np.concatenate([x for x, _, _ in own]), images)
        # Every example weighs 1 / global batch: a replica's weighted sum is its share.
        assert sum(float(np.sum(w)) for _, _, w in own) == pytest.approx(1.0, abs=1e-15)
    later = list(sharding.per_replica_batches(batches, 3, first=1, count=2))  # A second pipeline.
    assert [len(y) for _, y, _ in later] == [2, 2, 2, 2, 1, 0]


def test_without_files_or_internet_the_error_comes_in_seconds(tmp_path, monkeypatch):
    """Installed from a wheel there is no shared folder beside the code; without internet TFDS
    would retry DNS for minutes. tfdp says to pass --manual_dir within seconds."""
    import time

    monkeypatch.delenv("TFDP_MANUAL_DIR", raising=False)
    monkeypatch.setattr(fashion_mnist, "_SHARED_MANUAL_DIR", str(tmp_path / "none"))
    start = time.monotonic()
    try:
        tfds.prepare(fashion_mnist.DATASET, str(tmp_path / "tfds"), None)
    except UserError as e:
        assert "--manual_dir" in str(e)
    else:
        pytest.skip("this machine reached the download server and downloaded the data")
    assert time.monotonic() - start < 30


def prepared_copy(data_dir, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    version = next((copy / fashion_mnist.DATASET).iterdir())
    return copy, version


@pytest.mark.parametrize("damage", ["truncated", "not an array", "wrong shape",
                                    "a label out of range", "a pixel changed"])
def test_a_damaged_array_cache_is_rebuilt_with_a_warning(train_split, test_split, tmp_path,
                                                         caplog, damage):
    """Every source's arrays live in the one cache (tfdp.data.array_cache): a small .npz
    dataset's, whose rebuild reads 96 examples, where Fashion-MNIST's decodes 70,000."""
    np.savez(tmp_path / "small.npz", x_train=train_split.images[:64],
             y_train=train_split.labels[:64], x_test=test_split.images[:32],
             y_test=test_split.labels[:32])
    spec, data_dir = f"npz:{tmp_path / 'small.npz'}", str(tmp_path / "data")
    folder = sources.prepare(spec, data_dir).folder
    images, labels = array_cache.array_paths(folder, "test")
    if damage == "truncated":
        os.truncate(images, 1000)
    elif damage == "not an array":
        with open(images, "wb") as f:
            f.write(os.urandom(300))
    elif damage == "wrong shape":
        np.save(images, np.zeros((10, 28, 28), np.uint8))
    else:  # One byte, the shapes and dtypes unchanged.
        path = images if damage == "a pixel changed" else labels
        with open(path, "r+b") as f:
            f.seek(-8, os.SEEK_END)  # The last label's low byte; a pixel near the last image's.
            byte = f.read(1)[0]
            f.seek(-8, os.SEEK_END)
            f.write(bytes([(byte + 200) % 256]))
    split = pipeline.load_split("test", data_dir, dataset=spec)
    assert "the cached arrays in" in caplog.text and "are damaged" in caplog.text
    assert np.array_equal(split.images, test_split.images[:32])
    assert np.array_equal(split.labels, test_split.labels[:32])
    assert np.array_equal(np.load(images), split.images)  # The cache, rebuilt.


@pytest.mark.parametrize("damage", ["records", "dataset_info.json"])
def test_a_damaged_prepared_dataset_is_named_with_what_to_delete(data_dir, tmp_path, damage):
    copy, version = prepared_copy(data_dir, tmp_path)
    shutil.rmtree(copy / "tfdp-datasets" / "tfds-fashion_mnist")
    if damage == "records":
        records = next(version.glob("fashion_mnist-test.tfrecord-*"))
        os.truncate(records, records.stat().st_size // 2)
        folder = version
    else:
        (version / "dataset_info.json").write_text("{garbage")
        folder = copy / fashion_mnist.DATASET
    with pytest.raises(UserError, match=rf"^the prepared fashion_mnist in {folder} is damaged "
                                        rf"\(.*\): delete {folder} and run again to prepare it "
                                        "anew$"):
        pipeline.load_split("test", str(copy))
