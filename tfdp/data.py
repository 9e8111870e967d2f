"""Fashion-MNIST through tensorflow-datasets, offline-capable, read top to bottom.

1. ``find_manual_dir``: where the four original .gz files are (flag, $TFDP_MANUAL_DIR, or the
   shared folder beside this checkout).
2. ``prepare``: TFDS prepares the dataset in ``data_dir`` once, from those files when given (no
   download is tried), under a file lock so workers starting together do not collide.
3. ``load_split``: the whole split as uint8 / int64 arrays in memory (47 MB for train), read
   once per process and cached as .npy beside the TFDS data: short runs and tests would
   otherwise spend most of their time decoding the same images again.
4. ``train_batches`` / ``eval_batches``: a ``tf.data`` pipeline of global batches whose order
   depends only on (seed, epoch), so every path and device count sees the same batches. It
   does not autotune (``_pipeline_options``).
5. ``to_float``: uint8 pixels -> float in [0, 1], the model's input (the serving contract takes
   raw uint8 and applies the same function).
"""

import fcntl
import functools
import hashlib
import logging
import os
import socket
import threading
import urllib.parse
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf

from tfdp import logs
from tfdp.training import workdir
from tfdp.errors import UserError
from tfdp.logs import logger
from tfdp.plan import steps_per_epoch

DATASET = "fashion_mnist"
IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
# The checksums TFDS registers for the fashion_mnist release files.
MANUAL_FILES = {
    "train-images-idx3-ubyte.gz": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
    "train-labels-idx1-ubyte.gz": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    "t10k-images-idx3-ubyte.gz": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    "t10k-labels-idx1-ubyte.gz": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
}
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SHARED_MANUAL_DIR = os.path.join(_REPO_ROOT, "..", "shared", "data", "fashion_mnist")


class Split(NamedTuple):
    images: np.ndarray  # uint8 [n, 28, 28, 1]
    labels: np.ndarray  # int64 [n]


def find_manual_dir(manual_dir: Optional[str]) -> Optional[str]:
    """The folder to prepare from: the flag, else $TFDP_MANUAL_DIR, else the shared folder."""
    for candidate in (manual_dir, os.environ.get("TFDP_MANUAL_DIR"), _SHARED_MANUAL_DIR):
        if candidate and os.path.isdir(candidate):
            return os.path.abspath(candidate)
    return None


def check_manual_dir(manual_dir: str) -> None:
    """Refuse a manual dir with a missing or damaged file, naming the file."""
    for name, sha256 in MANUAL_FILES.items():
        path = os.path.join(manual_dir, name)
        if not os.path.isfile(path):
            raise UserError(f"{path} is missing: --manual_dir needs the four original "
                            f"Fashion-MNIST files ({', '.join(MANUAL_FILES)})")
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != sha256:
            raise UserError(f"{path} is damaged (sha256 {digest[:12]}..., expected "
                            f"{sha256[:12]}...): copy the original release file again")


def prepare(data_dir: Optional[str], manual_dir: Optional[str]):
    """Return the TFDS builder, preparing the dataset in ``data_dir`` first if needed."""
    import tensorflow_datasets as tfds  # Heavy import, only where the data is read.

    with logs.quiet_below(logging.ERROR, "absl"):  # See _prepare_once.
        return _prepare_once(tfds, data_dir, manual_dir)


def _prepare_once(tfds, data_dir, manual_dir):
    builder = tfds.builder(DATASET, data_dir=data_dir)
    if builder.is_prepared():
        return builder
    try:
        os.makedirs(builder.data_dir_root, exist_ok=True)
        lock = _acquire_lock(os.path.join(builder.data_dir_root, f".{DATASET}.lock"))
    except OSError as e:
        raise UserError(f"{DATASET} is not prepared in {builder.data_dir_root}, and it cannot be "
                        f"prepared there ({e.strerror or e}): give a --data_dir you can write "
                        "to, or one where it is prepared") from None
    try:
        builder = tfds.builder(DATASET, data_dir=data_dir)
        if builder.is_prepared():  # Another worker prepared it while we waited.
            return builder
        manual = find_manual_dir(manual_dir)
        if manual:
            check_manual_dir(manual)
            logger.info("preparing %s in %s from %s (once per data dir)", DATASET,
                        builder.data_dir_root, manual)
        else:
            _check_download_reachable(getattr(builder, "URL", None))
            logger.info("preparing %s in %s: downloading", DATASET, builder.data_dir_root)
        if not logs.verbose():
            # tfdp's line above says what happens. TFDS would add a hundred lines of tqdm bars,
            # two lines on stdout, and (through absl, quietened by the caller) warnings that the
            # folder it is about to write has no dataset_info.json yet.
            tfds.disable_progress_bar()
        try:
            with logs.stdout_dropped_unless_verbose():
                builder.download_and_prepare(
                    download_config=tfds.download.DownloadConfig(manual_dir=manual))
        except Exception as e:  # TFDS raises many kinds; all mean "could not get the data".
            where = f"from --manual_dir={manual}" if manual else "by downloading"
            raise UserError(
                f"could not prepare {DATASET} in {builder.data_dir_root} {where} "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); without "
                "internet pass --manual_dir=<folder with the four Fashion-MNIST .gz files>")
    finally:
        os.close(lock)  # Releases the lock.
    return builder


_REACH_SECONDS = 5


def _check_download_reachable(url: Optional[str]) -> None:
    """Fail in seconds, not minutes, where the download cannot work: without internet TFDS
    retries its DNS look-ups for more than 150 s before giving up."""
    if not url:
        return
    parsed = urllib.parse.urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    outcome = []

    def connect():
        try:
            socket.create_connection((parsed.hostname, port), timeout=_REACH_SECONDS).close()
            outcome.append(True)
        except OSError:
            pass

    probe = threading.Thread(target=connect, daemon=True)  # A DNS look-up has no timeout.
    probe.start()
    probe.join(_REACH_SECONDS)
    if not outcome:
        raise UserError(f"{DATASET} is not prepared, no manual dir was found, and its download "
                        f"server did not answer within {_REACH_SECONDS} s: pass "
                        "--manual_dir=<folder with the four Fashion-MNIST .gz files> (or set "
                        "TFDP_MANUAL_DIR)")


@functools.lru_cache(maxsize=None)
def load_split(split: str, data_dir: Optional[str] = None,
               manual_dir: Optional[str] = None) -> Split:
    """The whole ``split`` ("train" or "test") as in-memory arrays, read once per process.

    The first read goes through TFDS (decoding 60,000 PNGs: seconds) and leaves the arrays as
    .npy files beside the prepared data; later runs, workers and tests load those at once.
    """
    import tensorflow_datasets as tfds

    builder = prepare(data_dir, manual_dir)
    paths = array_paths(builder.data_dir, split)
    cache = os.path.dirname(paths[0])
    if all(os.path.exists(p) for p in paths):
        images, labels = (np.load(p) for p in paths)
    else:
        arrays = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
        images, labels = arrays["image"], arrays["label"].astype(np.int64)
        try:  # A cache only: a read-only data dir (a shared mount) still trains.
            os.makedirs(cache, exist_ok=True)
            for path, array in zip(paths, (images, labels)):
                workdir.write_atomic(path, lambda f, a=array: np.save(f, a), mode="wb")
        except OSError as e:
            logger.info("not caching %s as .npy in %s (%s): decoding it each run", split, cache,
                        e.strerror or e)
    images.setflags(write=False)
    labels.setflags(write=False)
    return Split(images, labels)


def array_paths(prepared_dir: str, split: str) -> list:
    """Where ``load_split`` keeps a split's arrays: [images .npy, labels .npy]. A worker of the
    from-scratch path across machines reads them there (``read_npy``)."""
    return [os.path.join(prepared_dir, "tfdp-arrays", f"{split}-{part}.npy")
            for part in ("images", "labels")]


def prepared_dir(data_dir: Optional[str]) -> str:
    """The folder TFDS prepares the dataset in under ``data_dir`` (nothing is read or made)."""
    import tensorflow_datasets as tfds

    with logs.quiet_below(logging.ERROR, "absl"):
        return tfds.builder(DATASET, data_dir=data_dir).data_dir


def read_npy(path: str, dtype: tf.DType, item_shape: tuple) -> tf.Tensor:
    """A ``.npy`` file written by ``np.save`` (format 1.0: magic, 2-byte header length, header,
    data) read with TensorFlow ops only, so that it runs on whichever device, local or on a
    remote worker, the caller places it: the array never passes through the caller."""
    content = tf.io.read_file(path)
    tf.debugging.assert_equal(tf.strings.substr(content, 0, 8), b"\x93NUMPY\x01\x00",
                              message=f"{path} is not a version 1.0 .npy file")
    header = tf.cast(tf.io.decode_raw(tf.strings.substr(content, 8, 2), tf.uint16)[0], tf.int32)
    body = tf.strings.substr(content, 10 + header, -1)
    return tf.reshape(tf.io.decode_raw(body, dtype), [-1, *item_shape])


def load_splits(data_dir: Optional[str] = None, manual_dir: Optional[str] = None,
                synthetic: bool = False):
    """(train, test) for a run: the real Fashion-MNIST, or synthetic arrays of its sizes."""
    if synthetic:
        return synthetic_split(60000, seed=1), synthetic_split(10000, seed=2)
    return load_split("train", data_dir, manual_dir), load_split("test", data_dir, manual_dir)


def synthetic_split(num_examples: int, seed: int = 0) -> Split:
    """Random images and labels of the real shapes, made in memory (benchmarks, no input cost)."""
    rng = np.random.default_rng(seed)
    return Split(rng.integers(0, 256, (num_examples, *IMAGE_SHAPE), dtype=np.uint8),
                 rng.integers(0, NUM_CLASSES, num_examples, dtype=np.int64))


# Fixed parallelism and buffers, autotuning off. Batches are gathers from arrays in memory, so
# autotuning has nothing to find, and its background thread makes dropping an iterator wait
# for that thread's next wake-up, seconds and more as training goes on (docs/benchmarks.md,
# "Figures behind code comments"; tfdp/keras_path/evaluation.py).
_PARALLEL_CALLS = 2
_PREFETCH = 2


def _pipeline_options() -> tf.data.Options:
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled example order of one epoch: a function of (seed, epoch) only."""
    return np.random.default_rng([seed, epoch]).permutation(num_examples).astype(np.int32)


def train_batches(split: Split, batch_size: int, seed: int, first_epoch: int, epochs: int,
                  steps_cap: Optional[int] = None) -> tf.data.Dataset:
    """Global batches for epochs ``first_epoch .. epochs-1``, one epoch after another.

    Each epoch holds exactly ``steps_per_epoch(n, batch_size, steps_cap)`` batches, so Keras'
    ``fit(steps_per_epoch=...)`` and a Python loop see the same batches in the same epochs.
    """
    images, labels = tf.constant(split.images), tf.constant(split.labels)
    batches = train_indices(len(split.labels), batch_size, seed, first_epoch, epochs,
                            steps_cap).map(lambda idx: (tf.gather(images, idx),
                                                        tf.gather(labels, idx)),
                                           num_parallel_calls=_PARALLEL_CALLS, deterministic=True)
    return batches.prefetch(_PREFETCH).with_options(_pipeline_options())


def train_indices(num_examples: int, batch_size: int, seed: int, first_epoch: int, epochs: int,
                  steps_cap: Optional[int] = None) -> tf.data.Dataset:
    """The example indices of ``train_batches``' batches, in the same order: what a cluster's
    client sends its workers, which hold the arrays."""
    steps = steps_per_epoch(num_examples, batch_size, steps_cap)
    order = np.stack([epoch_order(num_examples, seed, e)[: steps * batch_size]
                      for e in range(first_epoch, epochs)])
    return (tf.data.Dataset.from_tensor_slices(order)
            .flat_map(lambda idx: tf.data.Dataset.from_tensor_slices(idx).batch(batch_size)))


def eval_batches(split: Split, batch_size: int, steps_cap: Optional[int] = None) -> tf.data.Dataset:
    """The test set in order, in global batches (the last one short), optionally capped."""
    ds = tf.data.Dataset.from_tensor_slices((split.images, split.labels)).batch(batch_size)
    if steps_cap:
        ds = ds.take(steps_cap)
    return ds.prefetch(_PREFETCH).with_options(_pipeline_options())


def eval_indices(num_examples: int, batch_size: int, steps_cap: Optional[int] = None):
    """The example indices of ``eval_batches``' batches."""
    ds = tf.data.Dataset.range(num_examples).map(lambda i: tf.cast(i, tf.int32)).batch(batch_size)
    return ds.take(steps_cap) if steps_cap else ds


def to_float(images: tf.Tensor, dtype=tf.float32) -> tf.Tensor:
    """uint8 pixels -> ``dtype`` in [0, 1]: the models' input scaling, in one place."""
    return tf.cast(images, dtype) / 255.0


def _acquire_lock(path: str) -> int:
    """An exclusive ``flock`` on ``path`` (waits for it); closing the fd releases it."""
    # O_NOFOLLOW, no truncation: a symlink planted in a shared data dir is never followed.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd
