"""``--dataset=arrays:DIGEST``: arrays given to ``tfdp.run(dataset=...)``, which wrote them to the
cache under their digest (``tfdp.data.sources.from_arrays``); and what every source of arrays
does (``tfdp.data.npz`` too): the arrays checked (one line naming the one that cannot be
trained on), then written into the array cache, resized where ``--image_size`` asks.
"""

import os

import numpy as np

from tfdp.data import array_cache
from tfdp.data.image_folder import FITTED, fit, info
from tfdp.util.errors import UserError
from tfdp.util.logs import logger

KEYS = ("x_train", "y_train", "x_test", "y_test")


def cache_name(what: str, spec: str) -> str:
    return f"arrays-{what}"


def fingerprint(what: str):
    return None  # Arrays named by their digest never change.


def fill(what: str, spec: str, folder: str, size, data_dir, manual_dir) -> dict:
    raise UserError(f"--dataset={spec}: these arrays are not in the cache of --data_dir "
                    f"{os.path.dirname(os.path.dirname(folder))}: give the arrays to tfdp.run "
                    "again, with this data_dir")


def checked(arrays: dict, where: str) -> dict:
    """The four arrays as uint8 NHWC images and int64 labels, or one line naming the one that
    cannot be trained on."""
    missing = [k for k in KEYS if k not in arrays]
    if missing:
        raise UserError(f"{where}: {', '.join(missing)} missing (give {', '.join(KEYS)})")
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
    named = "class_names" in arrays
    names = [str(n) for n in np.asarray(arrays.get("class_names", range(classes))).ravel()]
    if int(checked["y_test"].max()) >= classes:
        raise UserError(f"{where}: y_test holds the label {checked['y_test'].max()}, out of "
                        f"y_train's range 0..{classes - 1}: a class never trained on")
    if len(names) < classes:
        raise UserError(f"{where}: class_names names {len(names)} classes, the labels go up to "
                        f"{classes - 1}")
    missing = sorted(set(range(classes)) - set(np.unique(checked["y_train"]).tolist()))
    if missing and not named:
        raise UserError(f"{where}: y_train has no example of class {_listed(missing)} (its "
                        f"labels go up to {classes - 1}): the model would have {classes} "
                        "outputs, some never trained; number the classes 0, 1, ... without "
                        "gaps, or give class_names naming every class to keep them")
    if missing:
        logger.warning("%s: y_train has no example of class %s (%s): the model keeps an output "
                       "for each, never trained", where, _listed(missing),
                       ", ".join(names[i] for i in missing[:10]))
    checked["class_names"] = tuple(names)
    return checked


def _listed(labels: list) -> str:
    shown = ", ".join(map(str, labels[:10]))
    return shown + (f" and {len(labels) - 10} more" if len(labels) > 10 else "")


def write(given: dict, folder: str, size, spec: str) -> dict:
    """``checked`` arrays into the cache ``folder``, resized to ``size`` where it differs; the
    cache's info."""
    from PIL import Image

    shape = given["x_train"].shape[1:]
    if size and tuple(size) != shape[:2]:
        shape = (*size, shape[2])
    for split in array_cache.SPLITS:
        images, labels = given[f"x_{split}"], given[f"y_{split}"]
        cached = array_cache.new_arrays(folder, split, len(labels), shape)
        if images.shape[1:] == shape:
            cached.images[:] = images
        else:
            for i, image in enumerate(images):
                cached.images[i] = fit(Image.fromarray(image.squeeze(-1) if shape[2] == 1
                                                       else image), shape)
        cached.labels[:] = labels
        cached.images.flush()
        cached.labels.flush()
    logger.info("--dataset=%s: %d training and %d test images of %s%s", spec,
                len(given["y_train"]), len(given["y_test"]), "x".join(map(str, shape)),
                f", each fitted {FITTED}" if shape != given["x_train"].shape[1:] else "")
    return info(shape, given["class_names"],
                {split: len(given[f"y_{split}"]) for split in array_cache.SPLITS})
