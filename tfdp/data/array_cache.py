"""tfdp's array cache: a prepared dataset as .npy files, read memory-mapped.

One folder per dataset (``tfdp.data.sources`` decides where and fills it)::

    train-images.npy  train-labels.npy  test-images.npy  test-labels.npy   uint8 NHWC, int64
    digests.sha256    the arrays' SHA-256, written after them
    info.json         what the data is (shape, classes, names, sizes), written last

A dataset with no test set (an image folder of ``ROOT/<class>/*``) has no test arrays; one whose
training set was split (``--validation_split``, ``tfdp.data.validation``) has validation arrays
too: ``info.json``'s ``examples`` names the splits a folder holds.

A folder without ``info.json`` is one whose writing was cut short; arrays whose digests no longer
match were damaged since (a flipped byte keeps shapes and dtypes): both are made again. The
arrays are read with ``mmap_mode="r"``: a batch reads its own examples from the page cache, so a
dataset larger than the run's memory trains. A worker of a cluster reads them with TensorFlow
ops where it runs (``read_npy``).
"""

import hashlib
import json
import os
import shutil
from typing import NamedTuple

import numpy as np

from tfdp.util import files
from tfdp.util.logs import logger

INFO = "info.json"
SPLITS = ("train", "test")  # What a source gives; "test" may be missing (splits_of).
VALIDATION = "validation"   # Held out of "train" by --validation_split.
_FORMAT = 1
_CHUNK = 1 << 24


class Split(NamedTuple):
    images: np.ndarray  # uint8 [n, height, width, channels], memory-mapped
    labels: np.ndarray  # int64 [n]


def array_paths(folder: str, split: str) -> list:
    """[images .npy, labels .npy] of ``split`` in a cache folder."""
    return [os.path.join(folder, f"{split}-{part}.npy") for part in ("images", "labels")]


def new_arrays(folder: str, split: str, count: int, image_shape: tuple) -> Split:
    """Writable .npy files of ``count`` examples, to fill in place (a dataset larger than
    memory is written as it is read); ``finish`` seals the folder."""
    os.makedirs(folder, exist_ok=True)
    images_path, labels_path = array_paths(folder, split)
    return Split(_allocated(images_path, np.uint8, (count, *image_shape)),
                 _allocated(labels_path, np.int64, (count,)))


def _allocated(path: str, dtype, shape: tuple) -> np.memmap:
    """A .npy file (format 1.0, as ``tfdp.data.pipeline.read_npy`` reads) of ``shape``, its blocks
    allocated before it is mapped: a disk too small fails here with ENOSPC, where a write into
    a sparse mapping would kill the process with SIGBUS."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {
            "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
            "shape": shape})
        offset = f.tell()
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        os.posix_fallocate(f.fileno(), offset, max(size, 1))
    return np.memmap(path, dtype, "r+", offset, shape)


def splits_of(info: dict) -> list:
    """The splits a cache folder of ``info`` holds, in a fixed order."""
    return [split for split in ("train", VALIDATION, "test") if split in info["examples"]]


def finish(folder: str, info: dict) -> None:
    """Flush the arrays, write their digests, then ``info.json``: the folder is complete."""
    digests = []
    for split in splits_of(info):
        for path in array_paths(folder, split):
            digests.append(f"{_digest(path)}  {os.path.basename(path)}\n")
    files.write_atomic(os.path.join(folder, "digests.sha256"), lambda f: f.write("".join(digests)))
    files.write_atomic(os.path.join(folder, INFO),
                       lambda f: json.dump({**info, "format": _FORMAT}, f, indent=1))


def read_info(folder: str):
    """The folder's ``info.json`` as a dict, or None where there is none (not made, or cut
    short)."""
    try:
        with open(os.path.join(folder, INFO)) as f:
            info = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        logger.warning("%s is damaged (%s): preparing the data again", os.path.join(folder, INFO),
                       e)
        return None
    return info if info.get("format") == _FORMAT else None


def intact(folder: str, info: dict) -> bool:
    """Whether the arrays still have the digests written with them (read through once)."""
    try:
        with open(os.path.join(folder, "digests.sha256")) as f:
            written = f.read()
        now = "".join(f"{_digest(p)}  {os.path.basename(p)}\n"
                      for split in splits_of(info) for p in array_paths(folder, split))
    except OSError as e:
        logger.warning("the cached arrays in %s cannot be read (%s): preparing the data again",
                       folder, e.strerror or e)
        return False
    if now != written:
        logger.warning("the cached arrays in %s are damaged (their contents changed since they "
                       "were written: SHA-256): preparing the data again", folder)
        return False
    return True


def load(folder: str, split: str, examples: int, image_shape: tuple) -> Split:
    """``split``'s arrays, memory-mapped read-only, checked against what info.json says."""
    images, labels = (np.load(p, mmap_mode="r", allow_pickle=False)
                      for p in array_paths(folder, split))
    expected = (examples, *image_shape)
    if images.dtype != np.uint8 or images.shape != expected or labels.shape != expected[:1] \
            or labels.dtype != np.int64:
        raise ValueError(f"{folder}: {split} arrays of {images.dtype} {images.shape} and "
                         f"{labels.dtype} {labels.shape}, info.json says uint8 {expected}")
    return Split(images, labels)


def _digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def remove(folder: str) -> None:
    """A folder whose making failed: nothing half-made is left."""
    shutil.rmtree(folder, ignore_errors=True)


def named_by_path(kind: str, what: str, name: str) -> str:
    """The cache folder's name of a source read from the file or folder ``what`` (``name``:
    what run folders call it): apart for every path."""
    tag = hashlib.sha256(os.path.abspath(what).encode()).hexdigest()[:12]
    return f"{kind}-{name}-{tag}"


def fingerprint(what: str) -> str:
    """What tells that the file or folder ``what`` changed since it was prepared: its size and
    modification time, or every file's name, size and modification time."""
    digest = hashlib.sha256()
    if os.path.isfile(what):
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
