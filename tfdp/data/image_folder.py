"""An image folder as ``--dataset=folder:ROOT`` reads it, in either layout
``keras.utils.image_dataset_from_directory`` reads: ``ROOT/<class>/*``, a training set that
``--validation_split`` divides (``tfdp.data.validation``), or ``ROOT/train/<class>/*`` and
``ROOT/test/<class>/*``; the class names the sorted folder names; into the array cache
(``tfdp.data.sources``).

Every file's header is read first (its size and mode: grayscale when every image is, RGB
otherwise; the most common size unless ``--image_size`` says), then every image decoded into
the cache, with a line every few seconds; one line names a file that cannot be read.
"""

import collections
import os
import time

import numpy as np

from tfdp.config import dataset_spec
from tfdp.data import array_cache
from tfdp.util.errors import UserError
from tfdp.util.logs import logger

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
GRAY_MODES = ("1", "L", "LA", "I", "I;16", "F")
_PROGRESS_S = 5.0


LAYOUTS = ("ROOT/<class>/* (a training set, --validation_split holds part of it out) or "
           "ROOT/train/<class>/* and ROOT/test/<class>/*")


def _listing(root_: str, spec: str) -> tuple:
    """(class names, {split: [(path, label), ...]}): ``ROOT/train|test/<class>/*`` where ROOT
    holds ``train/`` or ``test/``, both splits with the same classes; else ``ROOT/<class>/*``,
    a training set alone (``image_dataset_from_directory``'s one-folder layout)."""
    if not any(os.path.isdir(os.path.join(root_, split)) for split in array_cache.SPLITS):
        classes, listed = _classes(root_, spec)
        return classes, {"train": listed}
    found = {split: _classes(os.path.join(root_, split), spec) for split in array_cache.SPLITS}
    if found["train"][0] != found["test"][0]:
        only = sorted(set(found["train"][0]) ^ set(found["test"][0]))
        raise UserError(f"--dataset={spec}: train and test have different class folders "
                        f"({', '.join(only)} in one only): a class's label is its place in the "
                        "sorted names, so both need the same")
    return found["train"][0], {split: listed for split, (_, listed) in found.items()}


def _classes(top: str, spec: str) -> tuple:
    """(the class folders' names, sorted; [(path, label), ...]) of ``top``'s class folders,
    none empty. Dot-named entries (.ipynb_checkpoints, .DS_Store) are skipped, as Keras skips
    them."""
    if not os.path.isdir(top):
        raise UserError(f"--dataset={spec}: there is no folder {top} (the layouts: {LAYOUTS})")
    classes = sorted(d for d in os.listdir(top)
                     if not d.startswith(".") and os.path.isdir(os.path.join(top, d)))
    if not classes:
        raise UserError(f"--dataset={spec}: {top} holds no class folders (one subfolder per "
                        f"class, named as the class; the layouts: {LAYOUTS})")
    listed = []
    for label, name in enumerate(classes):
        images = sorted(f for f in os.listdir(os.path.join(top, name))
                        if not f.startswith(".") and f.lower().endswith(IMAGE_EXTENSIONS))
        if not images:
            raise UserError(f"--dataset={spec}: the class folder {os.path.join(top, name)} "
                            f"holds no images ({', '.join(IMAGE_EXTENSIONS)})")
        listed += [(os.path.join(top, name, f), label) for f in images]
    return classes, listed


def cache_name(what: str, spec: str) -> str:
    return array_cache.named_by_path("folder", what, dataset_spec.name_of(spec))


def fingerprint(what: str) -> str:
    return array_cache.fingerprint(what)


def fill(what: str, spec: str, folder: str, size, data_dir, manual_dir) -> dict:
    return write(what, spec, folder, size)


def write(root_: str, spec: str, folder: str, size) -> dict:
    from PIL import Image

    classes, listed = _listing(root_, spec)
    sizes, gray = collections.Counter(), True
    for split in listed:  # Headers only: sizes and modes, every file opened.
        for path, _ in listed[split]:
            try:
                with Image.open(path) as image:
                    sizes[image.size[::-1]] += 1
                    gray = gray and image.mode in GRAY_MODES
            except Exception as e:  # PIL raises many kinds; all mean "not an image".
                raise UserError(f"--dataset={spec}: {path} is not an image PIL can read "
                                f"({type(e).__name__}: {str(e)[:120]})") from None
    shape = (*(size or _most_common(sizes, spec)), 1 if gray else 3)
    counts = {split: len(listed[split]) for split in listed}
    progress = _Progress(spec, sum(counts.values()))
    for split in listed:
        arrays = array_cache.new_arrays(folder, split, counts[split], shape)
        for i, (path, label) in enumerate(listed[split]):
            try:
                with Image.open(path) as image:
                    arrays.images[i] = fit(image, shape)
            except Exception as e:
                raise UserError(f"--dataset={spec}: {path} cannot be decoded "
                                f"({type(e).__name__}: {str(e)[:120]})") from None
            arrays.labels[i] = label
            progress.step()
        arrays.images.flush()
        arrays.labels.flush()
    return info(shape, classes, counts)


def _most_common(sizes: collections.Counter, spec: str) -> tuple:
    """The most common size; a tie goes to the larger (more pixels, then the taller): a
    smaller size would throw detail away."""
    (height, width), _ = max(sizes.items(), key=lambda s: (s[1], s[0][0] * s[0][1], s[0][0]))
    if len(sizes) > 1:
        tied = sum(count == sizes[(height, width)] for count in sizes.values()) > 1
        logger.info("--dataset=%s: images of %d sizes, each fitted to %dx%d (the most common%s; "
                    "--image_size sets it) %s", spec, len(sizes), height, width,
                    ", the larger of a tie" if tied else "", FITTED)
    return height, width


# How an image of another size is made to fit, as Keras' image_dataset_from_directory(...,
# pad_to_aspect_ratio=True) does: nothing stretched, nothing cut off.
FITTED = "keeping their aspect ratio, the rest padded with black"


def fit(image, shape: tuple) -> np.ndarray:
    """A PIL image as uint8 [height, width, channels] of ``shape``: its mode converted and,
    where its size differs, scaled (bilinear) to fit inside keeping its aspect ratio, centred,
    the rest black (``FITTED``)."""
    from PIL import Image, ImageOps

    image = image.convert("L" if shape[2] == 1 else "RGB")
    if image.size != (shape[1], shape[0]):
        image = ImageOps.pad(image, (shape[1], shape[0]), Image.BILINEAR, color=0)
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


def info(shape: tuple, class_names, counts: dict) -> dict:
    """What ``info.json`` says of a dataset of ``shape`` images in ``class_names``."""
    return {"image_shape": list(shape), "num_classes": len(class_names),
            "class_names": list(class_names), "examples": counts}
