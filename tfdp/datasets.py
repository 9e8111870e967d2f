"""Your data: ``--dataset`` (``tfdp.dataset_spec``) prepared once into tfdp's array cache
(``tfdp.array_cache``), and what a run needs to know of it (``DatasetInfo``).

1. ``prepare(spec, data_dir, manual_dir, image_size)``: under a file lock, so that workers
   starting together prepare it once, the source is read into the cache unless an intact copy
   of it is there: a TFDS dataset (``tfdp.tfds_source``), an image folder, an .npz file, or
   arrays ``tfdp.run`` was given (``from_arrays``). Every image is checked on the way: one line
   names a file or array that cannot be trained on, and nothing is left half-made.
2. The image shape, channels and classes come from the data; images of different sizes are
   resized (bilinear) to one size: ``--image_size``, else the most common one, stated.
3. A folder or a file is read again when it changed since (its listing's sizes and times).
"""

import collections
import errno
import functools
import hashlib
import os
import time
from typing import NamedTuple, Optional

import numpy as np

from tfdp import array_cache, dataset_spec, files
from tfdp.errors import UserError
from tfdp.logs import logger

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
GRAY_MODES = ("1", "L", "LA", "I", "I;16", "F")
ARRAY_KEYS = ("x_train", "y_train", "x_test", "y_test")
_PROGRESS_S = 5.0


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
    if kind == "tfds":
        from tfdp import tfds_source

        return os.path.join(tfds_source.prepared_dir(what, data_dir), "tfdp-arrays" + sized)
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
    if kind == "tfds":
        from tfdp import tfds_source

        tfds_source.prepare(what, data_dir, manual_dir)  # The TFDS preparation, once.
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
        arrays = dict(zip(ARRAY_KEYS, arrays))
    checked = _checked_arrays(arrays, "tfdp.run(dataset=...)")
    digest = hashlib.sha256()
    for key in ARRAY_KEYS:
        digest.update(repr(checked[key].shape).encode())
        digest.update(np.ascontiguousarray(checked[key]).data)
    digest.update(repr(checked["class_names"]).encode())
    spec = f"arrays:{digest.hexdigest()[:32]}"
    folder = cache_folder(spec, data_dir)
    if not _usable(folder, None):
        held = _lock(folder)
        try:
            _made(folder, None, spec, lambda into: _write_arrays(checked, into, None, spec))
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
        from tfdp import tfds_source

        return tfds_source.write_arrays(what, data_dir, manual_dir, folder, size, _fit)
    if kind == "folder":
        return _write_folder(what, spec, folder, size)
    if kind == "npz":
        return _write_arrays(_read_npz(what), folder, size, spec)
    raise UserError(f"--dataset={spec}: these arrays are not in the cache of --data_dir "
                    f"{root(data_dir)}: give the arrays to tfdp.run again, with this data_dir")


# An image folder: ROOT/train/<class>/*, ROOT/test/<class>/*.

def _listing(root_: str, spec: str) -> tuple:
    """(class names, {split: [(path, label), ...]}), every split's classes the same, none
    empty."""
    found = {}
    for split in array_cache.SPLITS:
        top = os.path.join(root_, split)
        if not os.path.isdir(top):
            raise UserError(f"--dataset={spec}: there is no folder {top} (the layout: "
                            "ROOT/train/<class>/*.png and ROOT/test/<class>/*.png)")
        classes = sorted(d for d in os.listdir(top) if os.path.isdir(os.path.join(top, d)))
        if not classes:
            raise UserError(f"--dataset={spec}: {top} holds no class folders (one subfolder "
                            "per class, named as the class)")
        listed = []
        for label, name in enumerate(classes):
            images = sorted(f for f in os.listdir(os.path.join(top, name))
                            if f.lower().endswith(IMAGE_EXTENSIONS))
            if not images:
                raise UserError(f"--dataset={spec}: the class folder {os.path.join(top, name)} "
                                f"holds no images ({', '.join(IMAGE_EXTENSIONS)})")
            listed += [(os.path.join(top, name, f), label) for f in images]
        found[split] = (classes, listed)
    if found["train"][0] != found["test"][0]:
        only = sorted(set(found["train"][0]) ^ set(found["test"][0]))
        raise UserError(f"--dataset={spec}: train and test have different class folders "
                        f"({', '.join(only)} in one only): a class's label is its place in the "
                        "sorted names, so both need the same")
    return found["train"][0], {split: listed for split, (_, listed) in found.items()}


def _write_folder(root_: str, spec: str, folder: str, size) -> dict:
    from PIL import Image

    classes, listed = _listing(root_, spec)
    sizes, gray = collections.Counter(), True
    for split in array_cache.SPLITS:  # Headers only: sizes and modes, every file opened.
        for path, _ in listed[split]:
            try:
                with Image.open(path) as image:
                    sizes[image.size[::-1]] += 1
                    gray = gray and image.mode in GRAY_MODES
            except Exception as e:  # PIL raises many kinds; all mean "not an image".
                raise UserError(f"--dataset={spec}: {path} is not an image PIL can read "
                                f"({type(e).__name__}: {str(e)[:120]})") from None
    shape = (*(size or _most_common(sizes, spec)), 1 if gray else 3)
    counts = {split: len(listed[split]) for split in array_cache.SPLITS}
    progress = _Progress(spec, sum(counts.values()))
    for split in array_cache.SPLITS:
        arrays = array_cache.new_arrays(folder, split, counts[split], shape)
        for i, (path, label) in enumerate(listed[split]):
            try:
                with Image.open(path) as image:
                    arrays.images[i] = _fit(image, shape)
            except Exception as e:
                raise UserError(f"--dataset={spec}: {path} cannot be decoded "
                                f"({type(e).__name__}: {str(e)[:120]})") from None
            arrays.labels[i] = label
            progress.step()
        arrays.images.flush()
        arrays.labels.flush()
    return _info(shape, classes, counts)


def _most_common(sizes: collections.Counter, spec: str) -> tuple:
    (height, width), _ = sizes.most_common(1)[0]
    if len(sizes) > 1:
        logger.info("--dataset=%s: images of %d sizes, resized to %dx%d (the most common; "
                    "--image_size sets it)", spec, len(sizes), height, width)
    return height, width


def _fit(image, shape: tuple) -> np.ndarray:
    """A PIL image as uint8 [height, width, channels] of ``shape``: its mode converted, resized
    (bilinear) where its size differs."""
    from PIL import Image

    image = image.convert("L" if shape[2] == 1 else "RGB")
    if image.size != (shape[1], shape[0]):
        image = image.resize((shape[1], shape[0]), Image.BILINEAR)
    return np.asarray(image, np.uint8).reshape(shape)


class _Progress:
    """A line every few seconds while a large dataset is prepared."""

    def __init__(self, spec: str, total: int):
        self.spec, self.total, self.done, self.last = spec, total, 0, time.monotonic()

    def step(self):
        self.done += 1
        if time.monotonic() - self.last >= _PROGRESS_S:
            self.last = time.monotonic()
            logger.info("preparing --dataset=%s: %d of %d images", self.spec, self.done,
                        self.total)


# Arrays: an .npz file (Keras' mnist.npz form), or tfdp.run's.

def _read_npz(path: str) -> dict:
    spec = f"npz:{path}"
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in ARRAY_KEYS if k not in f.files]
            if missing:
                raise UserError(f"--dataset={spec}: the file lacks {', '.join(missing)} (it needs "
                                f"{', '.join(ARRAY_KEYS)}, as Keras' mnist.npz)")
            arrays = {k: f[k] for k in (*ARRAY_KEYS, "class_names") if k in f.files}
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"--dataset={spec}: not an .npz file numpy can read ({type(e).__name__}: "
                        f"{str(e)[:120]})") from None
    return _checked_arrays(arrays, f"--dataset={spec}")


def _checked_arrays(arrays: dict, where: str) -> dict:
    """The four arrays as uint8 NHWC images and int64 labels, or one line naming the one that
    cannot be trained on."""
    missing = [k for k in ARRAY_KEYS if k not in arrays]
    if missing:
        raise UserError(f"{where}: {', '.join(missing)} missing (give {', '.join(ARRAY_KEYS)})")
    checked = {}
    for split in array_cache.SPLITS:
        images, labels = np.asarray(arrays[f"x_{split}"]), np.asarray(arrays[f"y_{split}"])
        if images.dtype != np.uint8:
            raise UserError(f"{where}: x_{split} holds {images.dtype}: give uint8 pixels 0-255 "
                            "(tfdp scales them to [0, 1] itself, as it serves raw pixels)")
        if images.ndim == 3:
            images = images[..., None]
        if images.ndim != 4 or images.shape[3] not in (1, 3) or not len(images):
            raise UserError(f"{where}: x_{split} has shape {images.shape}: give N x H x W "
                            "(grayscale) or N x H x W x C with C 1 or 3, N at least 1")
        if labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if not np.issubdtype(labels.dtype, np.integer) or labels.shape != images.shape[:1]:
            raise UserError(f"{where}: y_{split} has {labels.dtype} {labels.shape}: give one "
                            f"integer label per image of x_{split} ({len(images)})")
        if labels.min() < 0:
            raise UserError(f"{where}: y_{split} holds the label {labels.min()}: labels are "
                            "class numbers 0, 1, ...")
        checked[f"x_{split}"], checked[f"y_{split}"] = images, labels.astype(np.int64)
    if checked["x_train"].shape[1:] != checked["x_test"].shape[1:]:
        raise UserError(f"{where}: x_train's images are {checked['x_train'].shape[1:]}, x_test's "
                        f"{checked['x_test'].shape[1:]}: train and test need one shape")
    classes = int(checked["y_train"].max()) + 1
    names = [str(n) for n in np.asarray(arrays.get("class_names", range(classes))).ravel()]
    if int(checked["y_test"].max()) >= classes:
        raise UserError(f"{where}: y_test holds the label {checked['y_test'].max()}, out of "
                        f"y_train's range 0..{classes - 1}: a class never trained on")
    if len(names) < classes:
        raise UserError(f"{where}: class_names names {len(names)} classes, the labels go up to "
                        f"{classes - 1}")
    checked["class_names"] = tuple(names)
    return checked


def _write_arrays(checked: dict, folder: str, size, spec: str) -> dict:
    from PIL import Image

    shape = checked["x_train"].shape[1:]
    if size and tuple(size) != shape[:2]:
        shape = (*size, shape[2])
    for split in array_cache.SPLITS:
        images, labels = checked[f"x_{split}"], checked[f"y_{split}"]
        arrays = array_cache.new_arrays(folder, split, len(labels), shape)
        if images.shape[1:] == shape:
            arrays.images[:] = images
        else:
            for i, image in enumerate(images):
                arrays.images[i] = _fit(Image.fromarray(image.squeeze(-1) if shape[2] == 1
                                                        else image), shape)
        arrays.labels[:] = labels
        arrays.images.flush()
        arrays.labels.flush()
    logger.info("--dataset=%s: %d training and %d test images of %s", spec,
                len(checked["y_train"]), len(checked["y_test"]), "x".join(map(str, shape)))
    return _info(shape, checked["class_names"],
                 {split: len(checked[f"y_{split}"]) for split in array_cache.SPLITS})


def _info(shape: tuple, class_names, counts: dict) -> dict:
    return {"image_shape": list(shape), "num_classes": len(class_names),
            "class_names": list(class_names), "examples": counts}


def describe(info: DatasetInfo) -> str:
    """The run's line about its data."""
    return (f"data: {dataset_spec.name_of(info.spec)}, {info.examples['train']} training and "
            f"{info.examples['test']} test images of {'x'.join(map(str, info.image_shape))}, "
            f"{info.num_classes} classes")
