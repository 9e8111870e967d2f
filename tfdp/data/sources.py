"""Your data: ``--dataset`` (``tfdp.config.dataset_spec``) prepared once into tfdp's array cache
(``tfdp.data.array_cache``), and what a run needs to know of it (``DatasetInfo``).

1. ``prepare(spec, data_dir, manual_dir, image_size)``: under a file lock, so that workers
   starting together prepare it once, the source is read into the cache unless an intact copy
   of it is there: a TFDS dataset (``tfdp.data.tfds``), an image folder
   (``tfdp.data.image_folder``), an .npz file, or arrays ``tfdp.run`` was given (``from_arrays``;
   both ``tfdp.data.arrays``). Every image is checked on the way: one line
   names a file or array that cannot be trained on, and nothing is left half-made.
2. The image shape, channels and classes come from the data; images of different sizes are
   resized (bilinear) to one size: ``--image_size``, else the most common one, stated.
3. A folder or a file is read again when it changed since (its listing's sizes and times).
"""

import errno
import functools
import hashlib
import os
import re
from typing import NamedTuple, Optional

import numpy as np

from tfdp.config import dataset_spec
from tfdp.data import array_cache, arrays as array_source, image_folder
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


def cache_folder(spec: str, data_dir: Optional[str], image_size=None) -> str:
    """The array cache of ``spec`` under ``data_dir`` (nothing is read: a cluster's client
    names it to workers that prepared it)."""
    kind, what = dataset_spec.kind_of(spec)
    sized = f"-{'x'.join(map(str, dataset_spec.size(image_size)))}" if image_size else ""
    if kind == "tfds":  # Named as given (its config and version too): no TFDS call to find it.
        named = re.sub(r"[^\w.-]", "_", what)
        return os.path.join(root(data_dir), "tfdp-datasets", f"tfds-{named}{sized}")
    if kind == "arrays":
        return os.path.join(root(data_dir), "tfdp-datasets", f"arrays-{what}{sized}")
    where = os.path.abspath(what)
    tag = hashlib.sha256(where.encode()).hexdigest()[:12]
    return os.path.join(root(data_dir), "tfdp-datasets",
                        f"{kind}-{dataset_spec.name_of(spec)}-{tag}{sized}")


@functools.lru_cache(maxsize=None)
def prepare(spec: str = dataset_spec.DEFAULT, data_dir: Optional[str] = None,
            manual_dir: Optional[str] = None, image_size=None) -> DatasetInfo:
    """``spec``'s ``DatasetInfo``, its array cache made first where there is no intact one (in
    the user's cache folder where ``data_dir`` is read-only)."""
    kind, what = dataset_spec.kind_of(spec)
    folder = cache_folder(spec, data_dir, image_size)
    source = _fingerprint(kind, what)
    found = _usable(folder, source)
    if found:
        return DatasetInfo.of(spec, folder, found)

    def fill(into):
        return _fill(kind, what, spec, into, image_size, data_dir, manual_dir)

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


def from_arrays(arrays, data_dir: Optional[str] = None) -> str:
    """``tfdp.run(dataset=...)``'s arrays, (x_train, y_train, x_test, y_test) or a dict of those
    keys (and ``class_names``), written to the cache once: the spec that names them there."""
    if not isinstance(arrays, dict):
        if len(arrays) != 4:
            raise UserError("tfdp.run(dataset=...): give (x_train, y_train, x_test, y_test) or a "
                            "dict of those names, or a --dataset string")
        arrays = dict(zip(array_source.KEYS, arrays))
    checked = array_source.checked(arrays, "tfdp.run(dataset=...)")
    digest = hashlib.sha256()
    for key in array_source.KEYS:
        digest.update(repr(checked[key].shape).encode())
        digest.update(np.ascontiguousarray(checked[key]).data)
    digest.update(repr(checked["class_names"]).encode())
    spec = f"arrays:{digest.hexdigest()[:32]}"
    folder = cache_folder(spec, data_dir)
    if not _usable(folder, None):
        held = _lock(folder)
        try:
            _made(folder, None, spec, lambda into: array_source.write(checked, into, None, spec))
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


def _fingerprint(kind: str, what: str):
    """What tells that a folder or file changed since it was prepared: every file's name,
    size and modification time. TFDS' prepared datasets and given arrays do not change."""
    if kind not in ("folder", "npz"):
        return None
    digest = hashlib.sha256()
    if kind == "npz":
        status = os.stat(what)
        digest.update(f"{status.st_size} {status.st_mtime_ns}".encode())
        return digest.hexdigest()
    for top, folders, names in os.walk(what):
        folders.sort()
        for name in sorted(names):
            status = os.stat(os.path.join(top, name))
            relative = os.path.relpath(os.path.join(top, name), what)
            digest.update(f"{relative} {status.st_size} {status.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _fill(kind, what, spec, folder, image_size, data_dir, manual_dir) -> dict:
    size = dataset_spec.size(image_size) if image_size else None
    if kind == "tfds":
        from tfdp.data import tfds

        return tfds.write_arrays(what, data_dir, manual_dir, folder, size,
                                        image_folder.fit)
    if kind == "folder":
        return image_folder.write(what, spec, folder, size)
    if kind == "npz":
        return array_source.write(array_source.read_npz(what), folder, size, spec)
    raise UserError(f"--dataset={spec}: these arrays are not in the cache of --data_dir "
                    f"{root(data_dir)}: give the arrays to tfdp.run again, with this data_dir")


def describe(info: DatasetInfo) -> str:
    """The run's line about its data."""
    return (f"data: {dataset_spec.name_of(info.spec)}, {info.examples['train']} training and "
            f"{info.examples['test']} test images of {'x'.join(map(str, info.image_shape))}, "
            f"{info.num_classes} classes")
