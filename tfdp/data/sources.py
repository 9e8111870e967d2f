"""Your data: ``--dataset`` (``tfdp.config.dataset_spec``) prepared once into tfdp's array cache
(``tfdp.data.array_cache``), and what a run needs to know of it (``DatasetInfo``).

1. ``prepare(spec, data_dir, manual_dir, image_size)``: under a file lock, so that workers
   starting together prepare it once, the source is read into the cache unless an intact copy
   of it is there, by the module of its kind (``SOURCES``): a TFDS dataset
   (``tfdp.data.tfds``), an image folder (``tfdp.data.image_folder``), an .npz file
   (``tfdp.data.npz``), or arrays ``tfdp.run`` was given (``from_arrays``; ``tfdp.data.arrays``). Every image is checked on the way: one line
   names a file or array that cannot be trained on, and nothing is left half-made.
2. The image shape, channels and classes come from the data; images of different sizes are
   fitted to one size keeping their aspect ratio (``tfdp.data.image_folder.fit``):
   ``--image_size``, else the most common one (a tie: the larger), stated.
3. A folder or a file is read again when it changed since (its listing's sizes and times).
"""

import errno
import functools
import hashlib
import os
from typing import NamedTuple, Optional

import numpy as np

from tfdp.config import dataset_spec
from tfdp.data import array_cache, arrays, image_folder, npz, tfds
from tfdp.util import files
from tfdp.util.errors import UserError
from tfdp.util.logs import logger


class DatasetInfo(NamedTuple):
    spec: str             # --dataset, as given (or arrays:DIGEST)
    folder: str           # its array cache
    image_shape: tuple    # (height, width, channels)
    num_classes: int
    class_names: tuple    # what the export names each class
    examples: dict        # {"train": n, "test": m}

    @classmethod
    def of(cls, spec: str, folder: str, info: dict) -> "DatasetInfo":
        return cls(spec, folder, tuple(info["image_shape"]), int(info["num_classes"]),
                   tuple(info["class_names"]), dict(info["examples"]))


def root(data_dir: Optional[str]) -> str:
    """Where datasets are prepared: ``--data_dir``, else TFDS' own default."""
    return os.path.abspath(data_dir or os.environ.get("TFDS_DATA_DIR")
                           or os.path.expanduser("~/tensorflow_datasets"))


# Every kind of --dataset (tfdp.config.dataset_spec.KINDS), each a module of its own with the
# same three functions: cache_name(what, spec), its cache folder's name; fingerprint(what), what
# tells that it changed since it was prepared (None: it never does); fill(what, spec, folder,
# size, data_dir, manual_dir), its arrays written into the cache folder, returning its info.
SOURCES = {"tfds": tfds, "folder": image_folder, "npz": npz, "arrays": arrays}


def source_of(spec: str) -> tuple:
    """(the module that reads ``spec``'s kind, what it names: a TFDS name, a path, a digest)."""
    kind, what = dataset_spec.kind_of(spec)
    return SOURCES[kind], what


def cache_folder(spec: str, data_dir: Optional[str], image_size=None) -> str:
    """The array cache of ``spec`` under ``data_dir`` (nothing is read: a cluster's client
    names it to workers that prepared it)."""
    source, what = source_of(spec)
    sized = f"-{'x'.join(map(str, dataset_spec.size(image_size)))}" if image_size else ""
    return os.path.join(root(data_dir), "tfdp-datasets", source.cache_name(what, spec) + sized)


@functools.lru_cache(maxsize=None)
def prepare(spec: str = dataset_spec.DEFAULT, data_dir: Optional[str] = None,
            manual_dir: Optional[str] = None, image_size=None) -> DatasetInfo:
    """``spec``'s ``DatasetInfo``, its array cache made first where there is no intact one (in
    the user's cache folder where ``data_dir`` is read-only)."""
    kind, what = source_of(spec)
    folder = cache_folder(spec, data_dir, image_size)
    source = kind.fingerprint(what)
    found = _usable(folder, source)
    if found:
        return DatasetInfo.of(spec, folder, found)
    size = dataset_spec.size(image_size) if image_size else None

    def fill(into):
        return kind.fill(what, spec, into, size, data_dir, manual_dir)

    try:
        held = _lock(folder)
    except OSError as e:  # A read-only data dir (a shared mount) still trains.
        fallback = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser(
            "~/.cache"), "tfdp", "arrays", hashlib.sha256(folder.encode()).hexdigest()[:16])
        logger.info("not keeping the arrays of --dataset=%s in %s (%s): in %s instead", spec,
                    os.path.dirname(folder), e.strerror or e, fallback)
        folder, held = fallback, _lock(fallback)
    try:
        found = _made(folder, source, spec, fill)
    finally:
        files.unlock(f"{folder}.lock", held)
    return DatasetInfo.of(spec, folder, found)


def _lock(folder: str) -> int:
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    return files.locked(f"{folder}.lock")


def _made(folder: str, source, spec: str, fill) -> dict:
    """The cache ``folder``'s info once it is made by ``fill(folder)`` (unless another process
    made it while this one waited for the lock); nothing half-made is left."""
    found = _usable(folder, source)
    if found:
        return found
    logger.info("preparing --dataset=%s in %s (once)", spec, folder)
    array_cache.remove(folder)  # What an earlier tfdp or a damaged cache left.
    try:
        found = fill(folder)
        array_cache.finish(folder, {**found, "source": source})
    except OSError as e:
        array_cache.remove(folder)
        room = " (no space left on the device)" if e.errno == errno.ENOSPC else ""
        raise UserError(f"could not prepare --dataset={spec} in {folder}{room}: "
                        f"{e.strerror or e}; make room or give another --data_dir") from None
    except BaseException:
        array_cache.remove(folder)
        raise
    return found


def from_arrays(given, data_dir: Optional[str] = None) -> str:
    """``tfdp.run(dataset=...)``'s arrays, (x_train, y_train, x_test, y_test) or a dict of those
    keys (and ``class_names``), written to the cache once: the spec that names them there."""
    if not isinstance(given, dict):
        if len(given) != 4:
            raise UserError("tfdp.run(dataset=...): give (x_train, y_train, x_test, y_test) or a "
                            "dict of those names, or a --dataset string")
        given = dict(zip(arrays.KEYS, given))
    checked = arrays.checked(given, "tfdp.run(dataset=...)")
    digest = hashlib.sha256()
    for key in arrays.KEYS:
        digest.update(repr(checked[key].shape).encode())
        digest.update(np.ascontiguousarray(checked[key]).data)
    digest.update(repr(checked["class_names"]).encode())
    spec = f"arrays:{digest.hexdigest()[:32]}"
    folder = cache_folder(spec, data_dir)
    if not _usable(folder, None):
        held = _lock(folder)
        try:
            _made(folder, None, spec, lambda into: arrays.write(checked, into, None, spec))
        finally:
            files.unlock(f"{folder}.lock", held)
    return spec


def _usable(folder: str, source) -> Optional[dict]:
    info = array_cache.read_info(folder)
    if info is None:
        return None
    if info.get("source") != source:
        logger.info("the data of %s changed since it was prepared: preparing it again", folder)
        return None
    return info if array_cache.intact(folder) else None


def describe(info: DatasetInfo) -> str:
    """The run's line about its data."""
    return (f"data: {dataset_spec.name_of(info.spec)}, {info.examples['train']} training and "
            f"{info.examples['test']} test images of {'x'.join(map(str, info.image_shape))}, "
            f"{info.num_classes} classes")
