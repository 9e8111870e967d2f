"""Arrays as ``--dataset=npz:FILE`` (the form of Keras' ``mnist.npz``: ``x_train``,
``y_train``, ``x_test``, ``y_test``, optionally ``class_names``) and ``tfdp.run(dataset=...)``
give them: checked (one line naming the array that cannot be trained on), then written into the
array cache (``tfdp.data.sources``), resized where ``--image_size`` asks.
"""

import numpy as np

from tfdp.data import array_cache
from tfdp.data.image_folder import fit, info
from tfdp.util.errors import UserError
from tfdp.util.logs import logger

KEYS = ("x_train", "y_train", "x_test", "y_test")


def read_npz(path: str) -> dict:
    spec = f"npz:{path}"
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in KEYS if k not in f.files]
            if missing:
                raise UserError(f"--dataset={spec}: the file lacks {', '.join(missing)} (it needs "
                                f"{', '.join(KEYS)}, as Keras' mnist.npz)")
            arrays = {k: f[k] for k in (*KEYS, "class_names") if k in f.files}
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"--dataset={spec}: not an .npz file numpy can read ({type(e).__name__}: "
                        f"{str(e)[:120]})") from None
    return checked(arrays, f"--dataset={spec}")


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
    names = [str(n) for n in np.asarray(arrays.get("class_names", range(classes))).ravel()]
    if int(checked["y_test"].max()) >= classes:
        raise UserError(f"{where}: y_test holds the label {checked['y_test'].max()}, out of "
                        f"y_train's range 0..{classes - 1}: a class never trained on")
    if len(names) < classes:
        raise UserError(f"{where}: class_names names {len(names)} classes, the labels go up to "
                        f"{classes - 1}")
    checked["class_names"] = tuple(names)
    return checked


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
    logger.info("--dataset=%s: %d training and %d test images of %s", spec,
                len(given["y_train"]), len(given["y_test"]), "x".join(map(str, shape)))
    return info(shape, given["class_names"],
                {split: len(given[f"y_{split}"]) for split in array_cache.SPLITS})
