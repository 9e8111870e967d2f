"""SavedModel export with one serving contract for every path and model.

Contract (signature ``serving_default``):
  input   ``images``         uint8   [None, 28, 28, 1]  raw pixels, as TFDS yields them
  outputs ``logits``         float32 [None, 10]
          ``probabilities``  float32 [None, 10]
          ``classes``        int64   [None]

Each export is a new version ``<export_root>/<n>/`` (1, 2, ... as TF Serving expects). It is
written to a hidden temporary folder beside it and renamed into place, so a crash never leaves a
half-written version and never touches an earlier one.
"""

import os
import shutil
import tempfile

import tensorflow as tf

from tfdp import data
from tfdp.errors import UserError

SIGNATURE = "serving_default"


class ServingModule(tf.Module):
    """Wraps ``forward`` (float images in [0, 1] -> logits) with the serving contract.

    ``trackable`` owns the variables ``forward`` reads (a Keras model or a ``tf.Module``), so
    they are saved with it.
    """

    def __init__(self, forward, trackable):
        super().__init__(name="tfdp_serving")
        self.model = trackable
        self._forward = forward

    @tf.function(input_signature=[tf.TensorSpec([None, *data.IMAGE_SHAPE], tf.uint8,
                                                name="images")])
    def serve(self, images):
        logits = tf.cast(self._forward(data.to_float(images)), tf.float32)
        return {"logits": logits,
                "probabilities": tf.nn.softmax(logits),
                "classes": tf.argmax(logits, axis=-1, output_type=tf.int64)}


def check_export_root(export_root: str) -> None:
    """Fail at start-up, not after training, if versions cannot be written under ``export_root``."""
    if os.path.exists(export_root) and not os.path.isdir(export_root):
        raise UserError(f"--export_dir={export_root} is a file: give a folder for the "
                        "SavedModel versions")
    try:
        os.makedirs(export_root, exist_ok=True)
        with tempfile.TemporaryFile(dir=export_root):
            pass
    except OSError as e:
        raise UserError(f"--export_dir={export_root} is not writable ({e.strerror}): "
                        "choose a folder you can write to") from None


def existing_versions(export_root: str) -> list:
    if not os.path.isdir(export_root):
        return []
    return sorted(int(n) for n in os.listdir(export_root) if n.isdigit())


def export(module: ServingModule, export_root: str) -> str:
    """Save ``module`` as the next version under ``export_root``; return its path."""
    check_export_root(export_root)
    tmp = tempfile.mkdtemp(prefix=".partial-", dir=export_root)
    try:
        tf.saved_model.save(module, tmp, signatures={SIGNATURE: module.serve})
        while True:  # Another run may take a number at the same moment: take the next.
            versions = existing_versions(export_root)
            path = os.path.join(export_root, str((versions[-1] if versions else 0) + 1))
            try:
                os.rename(tmp, path)
                return path
            except OSError:
                if not os.path.exists(path):
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_scratch(module: ServingModule, path: str) -> None:
    """Save to a throwaway ``path`` (non-chief workers must take part in saving, then delete)."""
    try:
        tf.saved_model.save(module, path, signatures={SIGNATURE: module.serve})
    finally:
        shutil.rmtree(path, ignore_errors=True)
