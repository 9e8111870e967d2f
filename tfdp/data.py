"""Fashion-MNIST through tensorflow-datasets, offline-capable, read top to bottom.

1. ``tfdp.fashion_mnist.prepare``: TFDS prepares the dataset in ``data_dir`` once, from the
   four original files when they are found (no download is tried), under a file lock so
   workers starting together do not collide.
2. ``load_split``: the whole split as uint8 / int64 arrays in memory (47 MB for train), read
   once per process and cached as .npy beside the TFDS data: short runs and tests would
   otherwise spend most of their time decoding the same images again.
3. ``train_batches`` / ``eval_batches``: a ``tf.data`` pipeline of global batches whose order
   depends only on (seed, epoch), so every path and device count sees the same batches. It
   does not autotune (``_pipeline_options``). With ``--augment=flip`` each training example
   is mirrored left-right or not by (seed, epoch, example) alone: a batch's indices carry it
   (index ``i + n`` is example ``i`` mirrored, ``gather``), so every path, device count and
   cluster sees the same images.
4. ``to_float``: uint8 pixels -> float in [0, 1], the model's input (the serving contract takes
   raw uint8 and applies the same function).
"""

import functools
import hashlib
import logging
import os
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf

from tfdp import files
from tfdp import logs
from tfdp.fashion_mnist import DATASET, LABEL_NAMES, damaged_preparation, prepare
from tfdp.logs import logger

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
CLASS_NAMES = LABEL_NAMES  # What the export names each class.


class Split(NamedTuple):
    images: np.ndarray  # uint8 [n, 28, 28, 1]
    labels: np.ndarray  # int64 [n]


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
    cached = _cached_arrays(paths, split)
    if cached:
        images, labels = cached
    else:
        try:
            arrays = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
        except (tf.errors.OpError, ValueError, OSError) as e:
            raise damaged_preparation(builder.data_dir, e) from None
        images, labels = arrays["image"], arrays["label"].astype(np.int64)
        try:  # A cache only: a read-only data dir (a shared mount) still trains.
            os.makedirs(cache, exist_ok=True)
            for path, array in zip(paths, (images, labels)):
                files.write_atomic(path, lambda f, a=array: np.save(f, a), mode="wb")
            # Last: a cache without it is one whose writing was cut short.
            files.write_atomic(_digests_path(paths), lambda f: f.write(_digests(images, labels)))
        except OSError as e:
            logger.info("not caching %s as .npy in %s (%s): decoding it each run", split, cache,
                        e.strerror or e)
    images.setflags(write=False)
    labels.setflags(write=False)
    return Split(images, labels)


def _cached_arrays(paths: list, split: str):
    """(images, labels) from ``load_split``'s cache, or None where there is none or it is
    damaged (then it is rebuilt: a warning says so). Damage that keeps the shapes and dtypes
    (a flipped byte, a label out of range) is caught by the arrays' SHA-256 digests, written
    beside them."""
    if not all(os.path.exists(p) for p in paths):
        return None
    try:
        images, labels = (np.load(p, allow_pickle=False) for p in paths)
        if (images.dtype != np.uint8 or images.shape[1:] != (28, 28, 1)
                or labels.dtype != np.int64 or labels.shape != images.shape[:1]):
            raise ValueError(f"arrays of {images.dtype} {images.shape} and {labels.dtype} "
                             f"{labels.shape}")
        with open(_digests_path(paths)) as f:
            if f.read() != _digests(images, labels):
                raise ValueError("their contents changed since they were written (SHA-256)")
    except FileNotFoundError:  # Written by a tfdp before digests, or cut short: rebuilt.
        logger.info("the cached %s arrays in %s have no digests: decoding the prepared data "
                    "again", split, os.path.dirname(paths[0]))
        return None
    except (OSError, ValueError, EOFError) as e:
        logger.warning("the cached %s arrays in %s are damaged (%s): decoding the prepared data "
                       "again", split, os.path.dirname(paths[0]), str(e).splitlines()[0])
        return None
    return images, labels


def _digests_path(paths: list) -> str:
    return paths[0].replace("-images.npy", ".sha256")


def _digests(images: np.ndarray, labels: np.ndarray) -> str:
    return "".join(f"{hashlib.sha256(np.ascontiguousarray(a)).hexdigest()}  {name}\n"
                   for a, name in ((images, "images"), (labels, "labels")))


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


def epoch_mirrored(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """Which examples ``--augment=flip`` mirrors in one epoch: a function of (seed, epoch)
    only, drawn apart from the epoch's order."""
    return np.random.default_rng([seed, epoch, _FLIP_STREAM]).random(num_examples) < 0.5


_FLIP_STREAM = 1


def train_batches(split: Split, batch_size: int, seed: int, first_epoch: int, epochs: int,
                  steps: int, flip: bool = False) -> tf.data.Dataset:
    """Global batches for epochs ``first_epoch .. epochs-1``, one epoch after another, each of
    the first ``steps`` batches of its order (the plan's ``steps_per_epoch``: so Keras'
    ``fit(steps_per_epoch=...)`` and a Python loop see the same batches in the same epochs),
    with ``flip``: each example mirrored or not (``epoch_mirrored``)."""
    images, labels = tf.constant(split.images), tf.constant(split.labels)
    batches = train_indices(len(split.labels), batch_size, seed, first_epoch, epochs, steps,
                            flip).map(lambda idx: gather(images, labels, idx, flip),
                                                 num_parallel_calls=_PARALLEL_CALLS,
                                                 deterministic=True)
    return batches.prefetch(_PREFETCH).with_options(_pipeline_options())


def train_indices(num_examples: int, batch_size: int, seed: int, first_epoch: int, epochs: int,
                  steps: int, flip: bool = False) -> tf.data.Dataset:
    """The example indices of ``train_batches``' batches, in the same order (``i + n`` for
    example ``i`` mirrored): what a cluster's client sends its workers, which hold the
    arrays."""
    order = np.stack([_epoch_indices(num_examples, seed, e, flip)[: steps * batch_size]
                      for e in range(first_epoch, epochs)])
    return (tf.data.Dataset.from_tensor_slices(order)
            .flat_map(lambda idx: tf.data.Dataset.from_tensor_slices(idx).batch(batch_size)))


def _epoch_indices(num_examples: int, seed: int, epoch: int, flip: bool) -> np.ndarray:
    order = epoch_order(num_examples, seed, epoch)
    if not flip:
        return order
    return np.where(epoch_mirrored(num_examples, seed, epoch)[order], order + num_examples,
                    order).astype(np.int32)


def index_batches(num_examples: int, batch_size: int, seed: int, first_epoch: int,
                  offset: int, epochs: int, steps: int, flip: bool = False):
    """``train_indices`` from step ``offset`` of ``first_epoch``, each batch a 1-tuple: the
    input of a step that gathers its examples where the arrays live (a cluster's workers)."""
    return iter(train_indices(num_examples, batch_size, seed, first_epoch, epochs, steps,
                              flip).skip(offset).map(lambda i: (i,)))


def gather(images, labels, indices, flip: bool = False) -> tuple:
    """The examples ``indices`` name, as (images, labels): with ``flip``, index ``i + n`` (``n``
    examples) is example ``i`` mirrored left-right. Written once for every path: the local
    pipeline, a cluster's workers and the parameter-server workers."""
    if not flip:
        return tf.gather(images, indices), tf.gather(labels, indices)
    n = tf.cast(tf.shape(labels)[0], indices.dtype)
    x = tf.gather(images, indices % n)
    mirrored = tf.reshape(indices >= n, [-1, 1, 1, 1])
    return tf.where(mirrored, mirror(x), x), tf.gather(labels, indices % n)


def mirror(images):
    """NHWC images mirrored left-right (``--augment=flip``, ``--eval_flip``)."""
    return tf.reverse(images, [2])


def read_arrays(prepared: str, split: str) -> tuple:
    """A split's (images, labels) read with TensorFlow ops from ``array_paths`` (on the
    device, local or a remote worker's, that the caller places them)."""
    images_path, labels_path = array_paths(prepared, split)
    return read_npy(images_path, tf.uint8, IMAGE_SHAPE), read_npy(labels_path, tf.int64, ())


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
