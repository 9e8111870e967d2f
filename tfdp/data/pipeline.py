"""The examples a run trains on, read top to bottom.

1. ``tfdp.data.sources.prepare``: ``--dataset`` (Fashion-MNIST by default) prepared once into tfdp's
   array cache, described by a ``DatasetInfo`` (image shape, classes, names).
2. ``load_splits``: the train split and the one evaluated after every epoch (the validation
   split where ``--validation_split`` made one, else the test split) as arrays memory-mapped
   from that cache (``tfdp.data.array_cache``): a batch reads its own examples, so a dataset
   larger than the run's memory trains.
3. ``train_batches`` / ``eval_batches``: a ``tf.data`` pipeline of global batches whose order
   depends only on (seed, epoch), so every path and device count sees the same batches. It
   does not autotune (``_pipeline_options``). With ``--augment=flip`` each training example
   is mirrored left-right or not by (seed, epoch, example) alone: a batch's indices carry it
   (index ``i + n`` is example ``i`` mirrored), so every path, device count and cluster sees
   the same images. Each batch is gathered from the arrays by its indices (``reader``: in
   TensorFlow, or from the memory-mapped arrays where they are large; on a cluster's workers,
   which hold the arrays in memory, ``gather``).
4. ``to_float``: uint8 pixels -> float in [0, 1], the model's input (the serving contract takes
   raw uint8 and applies the same function).
"""

import json
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from tfdp.config import dataset_spec
from tfdp.data import array_cache, sources, validation
from tfdp.data.array_cache import Split
from tfdp.data.sources import DatasetInfo
from tfdp.util.errors import UserError


def dataset_of(config) -> DatasetInfo:
    """The run's ``DatasetInfo``: its data prepared here (once per process)."""
    return sources.prepare(config.dataset, config.data_dir, config.manual_dir,
                           config.image_size, config.validation_split, config.seed)


def dataset_on(device: str, name: str, config) -> DatasetInfo:
    """The run's ``DatasetInfo`` as the cluster worker owning ``device`` prepared it (its
    ``info.json``, read there: this process may hold no data at all). ``name`` names the worker
    in the error."""
    whole = _info_on(device, name, config,
                     sources.cache_folder(config.dataset, config.data_dir, config.image_size))
    share = validation.fraction(config.validation_split, whole.examples, config.dataset)
    if not share:
        return whole
    return _info_on(device, name, config, sources.split_folder(whole, share, config.seed))


def _info_on(device: str, name: str, config, folder: str) -> DatasetInfo:
    try:
        with tf.device(device):
            text = tf.io.read_file(os.path.join(folder, array_cache.INFO)).numpy()
    except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as e:
        raise UserError(f"{name} has not prepared --dataset={config.dataset} in {folder} "
                        f"({e.message.splitlines()[0][:120]}): start its tfdp.server with this "
                        "--dataset, --validation_split, --seed and --data_dir (it prepares the "
                        "data there), the same on every machine") from None
    return DatasetInfo.of(config.dataset, folder, json.loads(text))


def load_split(split: str, data_dir: Optional[str] = None, manual_dir: Optional[str] = None,
               dataset: str = dataset_spec.DEFAULT, image_size=None) -> Split:
    """``split`` ("train" or "test") of ``dataset``, memory-mapped from its array cache."""
    info = sources.prepare(dataset, data_dir, manual_dir, image_size)
    return array_cache.load(info.folder, split, info.examples[split], info.image_shape)


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


def load_splits(info: DatasetInfo, synthetic: bool = False) -> tuple:
    """(train, the split evaluated after every epoch) for a run: the data ``info`` describes,
    or random arrays of its sizes."""
    return tuple(load(info, split, synthetic) for split in ("train", info.evaluated))


def load(info: DatasetInfo, split: str, synthetic: bool = False) -> Split:
    """``split`` of the data ``info`` describes (memory-mapped), or random arrays of its
    size."""
    if synthetic:
        return synthetic_split(info.examples[split], info.image_shape, info.num_classes,
                               1 + array_cache.splits_of({"examples": info.examples}).index(split))
    return array_cache.load(info.folder, split, info.examples[split], info.image_shape)


def synthetic_split(num_examples: int, image_shape: tuple = (28, 28, 1), num_classes: int = 10,
                    seed: int = 0) -> Split:
    """Random images and labels of the data's shapes, made in memory (benchmarks, no input
    cost)."""
    rng = np.random.default_rng(seed)
    return Split(rng.integers(0, 256, (num_examples, *image_shape), dtype=np.uint8),
                 rng.integers(0, num_classes, num_examples, dtype=np.int64))


# Fixed parallelism and buffers, autotuning off. Batches are gathers from arrays in memory, so
# autotuning has nothing to find, and its background thread makes dropping an iterator wait
# for that thread's next wake-up, seconds and more as training goes on (docs/benchmarks.md,
# "Figures behind code comments"; tfdp/paths/keras/evaluation.py).
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
    read = reader(split)
    batches = train_indices(len(split.labels), batch_size, seed, first_epoch, epochs, steps,
                            flip).map(lambda idx: read(idx, flip),
                                      num_parallel_calls=_PARALLEL_CALLS, deterministic=True)
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


# Arrays up to this share of the memory the process is given are copied into TensorFlow, where
# a batch is one gather in the input graph; larger ones stay memory-mapped, and each batch reads
# its rows through numpy: a Python call per batch, which costs the textbook's epoch a few
# percent (docs/your-data.md), but trains a dataset larger than the memory.
IN_MEMORY_SHARE = 0.25


def reader(split: Split):
    """``read(indices, flip=False) -> (images, labels)``: the examples a batch names, from a
    copy of ``split`` in TensorFlow (``gather``) or from its memory-mapped arrays (``fetch``),
    the same examples either way."""
    if split.images.nbytes + split.labels.nbytes > IN_MEMORY_SHARE * memory_given():
        return lambda indices, flip=False: fetch(split, indices, flip)
    images, labels = tf.constant(split.images), tf.constant(split.labels)
    return lambda indices, flip=False: gather(images, labels, indices, flip)


def memory_given() -> int:
    """Bytes of memory this process may use: the machine's, or its control group's limit."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def fetch(split: Split, indices, flip: bool = False) -> tuple:
    """The examples ``indices`` name, read from ``split``'s (memory-mapped) arrays in this
    process, as ``gather`` reads them from tensors: index ``i + n`` is example ``i`` mirrored
    with ``flip``."""
    n = len(split.labels)
    # Plain arrays over the same mapping: indexing an np.memmap makes a memmap of each result.
    images, labels = np.asarray(split.images), np.asarray(split.labels)

    def read(rows):
        rows = rows % n
        return images[rows], labels[rows]

    x, y = tf.numpy_function(read, [indices], (tf.uint8, tf.int64), stateful=False)
    x.set_shape([None, *images.shape[1:]])
    y.set_shape([None])
    if not flip:
        return x, y
    return tf.where(tf.reshape(indices >= n, [-1, 1, 1, 1]), mirror(x), x), y


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


def read_arrays(folder: str, split: str, image_shape: tuple) -> tuple:
    """A split's (images, labels) read with TensorFlow ops from the array cache ``folder`` (on
    the device, local or a remote worker's, that the caller places them)."""
    images_path, labels_path = array_cache.array_paths(folder, split)
    return read_npy(images_path, tf.uint8, image_shape), read_npy(labels_path, tf.int64, ())


def eval_batches(split: Split, batch_size: int, steps_cap: Optional[int] = None) -> tf.data.Dataset:
    """The test set in order, in global batches (the last one short), optionally capped."""
    read = reader(split)
    ds = eval_indices(len(split.labels), batch_size, steps_cap).map(lambda idx: read(idx))
    return ds.prefetch(_PREFETCH).with_options(_pipeline_options())


def eval_indices(num_examples: int, batch_size: int, steps_cap: Optional[int] = None):
    """The example indices of ``eval_batches``' batches."""
    ds = tf.data.Dataset.range(num_examples).map(lambda i: tf.cast(i, tf.int32)).batch(batch_size)
    return ds.take(steps_cap) if steps_cap else ds


def to_float(images: tf.Tensor, dtype=tf.float32) -> tf.Tensor:
    """uint8 pixels -> ``dtype`` in [0, 1]: the models' input scaling, in one place."""
    return tf.cast(images, dtype) / 255.0
