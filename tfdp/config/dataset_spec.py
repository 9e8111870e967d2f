"""``--dataset``'s value, without reading anything: which images a run trains on.

* ``fashion_mnist`` (the default), ``mnist``, ``cifar10``, ...: a TFDS image-classification
  dataset by name (``name/config:version`` as TFDS writes it), prepared in ``--data_dir``;
* ``folder:ROOT``: ``ROOT/train/<class>/*`` and ``ROOT/test/<class>/*``, PNG or JPEG, the class
  names the folder names in sorted order (``keras.utils.image_dataset_from_directory``'s layout);
* ``npz:FILE``: ``x_train``, ``y_train``, ``x_test``, ``y_test`` (the form of Keras'
  ``mnist.npz``: uint8 images N x H x W or N x H x W x C, integer labels);
* ``arrays:DIGEST``: arrays given to ``tfdp.run(dataset=...)``, written to the cache under
  their SHA-256 (``tfdp.data.sources.from_arrays``).

``tfdp.data.sources`` prepares each into tfdp's array cache; ``check`` is the form's check when a
config is made; ``name_of`` is what run folders call it.
"""

import os
import re

from tfdp.util.errors import UserError

DEFAULT = "fashion_mnist"
KINDS = ("folder", "npz", "arrays")
_TFDS_NAME = re.compile(r"^[a-z][a-z0-9_]*(/[\w.-]+)?(:[\d.*]+)?$")
_DIGEST = re.compile(r"^[0-9a-f]{16,64}$")


def kind_of(spec: str) -> tuple:
    """(kind, what): ("tfds", name), ("folder", ROOT), ("npz", FILE) or ("arrays", digest)."""
    kind, colon, what = spec.partition(":")
    if colon and kind in KINDS:
        return kind, what
    return "tfds", spec


def check(spec: str, image_size) -> None:
    """The form of ``--dataset`` and ``--image_size`` (no file is read)."""
    kind, what = kind_of(spec)
    if kind == "tfds" and not _TFDS_NAME.match(what):
        raise UserError(f"--dataset={spec}: give a TFDS dataset's name (fashion_mnist, mnist, "
                        "cifar10, ...), folder:ROOT (ROOT/train/<class>/*, ROOT/test/<class>/*) "
                        "or npz:FILE (x_train, y_train, x_test, y_test)")
    if kind == "folder" and not os.path.isdir(what):
        raise UserError(f"--dataset={spec}: there is no folder {what or '(empty)'}")
    if kind == "npz" and not os.path.isfile(what):
        raise UserError(f"--dataset={spec}: there is no file {what or '(empty)'}")
    if kind == "arrays" and not _DIGEST.match(what):
        raise UserError(f"--dataset={spec}: arrays:DIGEST names arrays tfdp.run wrote to its "
                        "cache; give arrays to tfdp.run(dataset=(x_train, y_train, x_test, "
                        "y_test)) instead")
    if image_size is not None:
        size(image_size)


def size(image_size: str) -> tuple:
    """``--image_size``: ``H`` or ``HxW`` -> (H, W), each 8 to 4096 pixels."""
    parts = str(image_size).lower().split("x")
    if len(parts) not in (1, 2) or not all(p.isdigit() and 8 <= int(p) <= 4096 for p in parts):
        raise UserError(f"--image_size={image_size}: give HxW or one side for square images, "
                        "each 8 to 4096 pixels (for example 32 or 64x48)")
    return int(parts[0]), int(parts[-1])


def name_of(spec: str) -> str:
    """What folders call the dataset: its TFDS name, or its folder's or file's name."""
    kind, what = kind_of(spec)
    if kind == "tfds":
        return what.partition("/")[0].partition(":")[0]
    if kind == "arrays":
        return "arrays"
    base = os.path.basename(os.path.normpath(what))
    return re.sub(r"[^\w.-]", "_", os.path.splitext(base)[0] if kind == "npz" else base)
