"""``--validation_split=F``: a share of each class's training examples held out to evaluate on
while training, so that the choices a user makes watching the epoch lines are not made on the
test set, which is then evaluated once, at the end.

The split is a cache folder of its own beside the dataset's (``tfdp.data.sources``): ``train``
(the examples kept, in their order), ``validation`` (those held out, in their order) and the
dataset's ``test`` (linked). Which examples are held out is a function of the labels, ``F`` and
``--seed`` alone: in each class, ``round(F x n)`` of its ``n`` examples drawn at random (the
class keeps one at least), so every path, process and machine holds out the same ones, and each
class is held out in proportion (stratified, where Keras' ``validation_split`` cuts the last
share of a shuffled listing).

A dataset without a test set (an image folder of ``ROOT/<class>/*``, as Keras users keep one)
holds out ``WITHOUT_TEST`` of it unless ``--validation_split`` says otherwise.
"""

import os
import shutil

import numpy as np

from tfdp.data import array_cache
from tfdp.util.errors import UserError
from tfdp.util.logs import logger

WITHOUT_TEST = 0.2
# The generator's key beside --seed: apart from the epochs' orders' ([seed, epoch]) and flips'.
_STREAM = (0, 2)
_ROWS = 4096  # Examples copied at a time: a dataset larger than the memory is split too.


def fraction(asked, examples: dict, spec: str) -> float:
    """The share held out of a dataset of ``examples`` ({split: count}) when
    ``--validation_split`` is ``asked`` (None: 0 with a test set, ``WITHOUT_TEST`` without)."""
    if asked is None:
        return 0.0 if "test" in examples else WITHOUT_TEST
    if not asked and "test" not in examples:
        raise UserError(f"--dataset={spec} has no test set (ROOT/<class>/*): give "
                        "--validation_split above 0, the share of each class to evaluate on "
                        f"(default {WITHOUT_TEST:g})")
    return float(asked)


def suffix(share: float, seed: int) -> str:
    """What a split's cache folder adds to the dataset's folder name."""
    return f"-validation{share:g}-seed{seed}"


def held_out(labels: np.ndarray, share: float, seed: int) -> np.ndarray:
    """Which examples of ``labels`` are held out: a boolean mask, ``round(share x n)`` of each
    class's ``n`` (at most ``n - 1``), drawn by ``seed``."""
    rng = np.random.default_rng([seed, *_STREAM])
    mask = np.zeros(len(labels), bool)
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        count = min(int(round(share * len(rows))), len(rows) - 1)
        mask[rng.permutation(rows)[:count]] = True
    return mask


def write(base, folder: str, share: float, seed: int) -> dict:
    """The split of the prepared dataset ``base`` (a ``DatasetInfo``) written into the cache
    ``folder``; its info."""
    train = array_cache.load(base.folder, "train", base.examples["train"], base.image_shape)
    labels = np.asarray(train.labels)
    mask = held_out(labels, share, seed)
    if not mask.any():
        raise UserError(f"--validation_split={share:g} of --dataset={base.spec} holds out no "
                        f"example ({len(labels)} training examples, {base.num_classes} "
                        "classes): give a larger share")
    counts = {}
    for split, rows in (("train", np.flatnonzero(~mask)),
                        (array_cache.VALIDATION, np.flatnonzero(mask))):
        part = array_cache.new_arrays(folder, split, len(rows), base.image_shape)
        for start in range(0, len(rows), _ROWS):
            chosen = rows[start:start + _ROWS]
            part.images[start:start + len(chosen)] = train.images[chosen]
        part.labels[:] = labels[rows]
        part.images.flush()
        part.labels.flush()
        counts[split] = len(rows)
    if "test" in base.examples:
        for source, target in zip(array_cache.array_paths(base.folder, "test"),
                                  array_cache.array_paths(folder, "test")):
            _link_or_copy(source, target)
        counts["test"] = base.examples["test"]
    logger.info("--dataset=%s: %d of %d training examples held out for validation "
                "(--validation_split=%g of each class, drawn by --seed=%d)", base.spec,
                counts[array_cache.VALIDATION], len(labels), share, seed)
    return {"image_shape": list(base.image_shape), "num_classes": base.num_classes,
            "class_names": list(base.class_names), "examples": counts,
            "validation": {"split": share, "seed": seed}}


def _link_or_copy(source: str, target: str) -> None:
    """The dataset's test arrays, shared where the file system can (a cache folder is made
    again, never changed in place, so a link never sees them change)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
