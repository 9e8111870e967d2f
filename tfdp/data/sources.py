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
from tfdp.data import array_cache, arrays, image_folder, npz, tfds, validation
from tfdp.util import files
from tfdp.util.errors import UserError
from tfdp.util.logs import logger


class DatasetInfo(NamedTuple):
    spec: str             # --dataset, as given (or arrays:DIGEST)
    folder: str           # its array cache
    image_shape: tuple    # (height, width, channels)
    num_classes: int
    class_names: tuple    # what the export names each class
    examples: dict        # {"train": n, "test": m}, "validation" where it was split, no "test"
    validation: Optional[dict] = None  # {"split": F, "seed": seed} where it was split

    @classmethod
    def of(cls, spec: str, folder: str, info: dict) -> "DatasetInfo":
        return cls(spec, folder, tuple(info["image_shape"]), int(info["num_classes"]),
                   tuple(info["class_names"]), dict(info["examples"]), info.get("validation"))

    @property
    def evaluated(self) -> str:
        """The split evaluated after every epoch: the validation split where there is one."""
        return array_cache.VALIDATION if self.validation else "test"

    @property
    def uses(self) -> dict:
        """{what a run reads a split for: the split}: "train", "eval" (after every epoch) and,
        where a validation split is evaluated after every epoch and there is a test set,
        "test" (once after training)."""
        return {"train": "train", "eval": self.evaluated,
                **({"test": self.tested} if self.tested else {})}

    @property
    def tested(self) -> Optional[str]:
        """The split evaluated once at the end, apart: the test set, where a validation split
        is evaluated after every epoch."""
        return "test" if self.validation and "test" in self.examples else None


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
            manual_dir: Optional[str] = None, image_size=None,
            validation_split: Optional[float] = None, seed: int = 0) -> DatasetInfo:
    """``spec``'s ``DatasetInfo``, its array cache made first where there is no intact one (in
    the user's cache folder where ``data_dir`` is read-only), with ``validation_split`` of
    its training set held out by ``seed`` (``tfdp.data.validation``) in a cache of its own."""
    whole = _prepared(spec, data_dir, manual_dir, image_size)
    share = validation.fraction(validation_split, whole.examples, spec)
    if not share:
        return whole
    folder = split_folder(whole, share, seed)
    source = _digests_of(whole.folder)  # Made again when the dataset's arrays are.
    found = _usable(folder, source)
    if not found:
        held = _lock(folder)
        try:
            found = _made(folder, source, spec,
                          lambda into: validation.write(whole, into, share, seed))
        finally:
            files.unlock(f"{folder}.lock", held)
    return DatasetInfo.of(spec, folder, found)


def split_folder(whole: DatasetInfo, share: float, seed: int) -> str:
    """The cache folder of ``whole`` with ``share`` of its training set held out by ``seed``."""
    return whole.folder + validation.suffix(share, seed)


def _digests_of(folder: str) -> str:
    with open(os.path.join(folder, "digests.sha256"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _prepared(spec: str, data_dir: Optional[str], manual_dir: Optional[str],
              image_size) -> DatasetInfo:
    """``spec``'s ``DatasetInfo`` as its source gives it (every split it has)."""
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
    return info if array_cache.intact(folder, info) else None


def counted(counts: dict) -> str:
    """{split: examples} in words: "60000 training and 10000 test", "54000 training, 6000
    validation and 10000 test"."""
    parts = [f"{n} {'training' if split == 'train' else split}" for split, n in counts.items()]
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def describe(info: DatasetInfo) -> str:
    """The run's line about its data."""
    counts = info.examples
    parts = [f"{counts['train']} training"]
    if info.validation:
        parts.append(f"{counts[array_cache.VALIDATION]} validation (--validation_split="
                     f"{info.validation['split']:g}, evaluated after every epoch)")
    if "test" in counts:
        parts.append(f"{counts['test']} test" + (" (evaluated once, at the end)"
                                                  if info.validation else ""))
    return (f"data: {dataset_spec.name_of(info.spec)}, {', '.join(parts[:-1])} and {parts[-1]} "
            f"images of {'x'.join(map(str, info.image_shape))}, {info.num_classes} classes")
