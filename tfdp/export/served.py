"""An export read back for use: its newest version, its serving signature called on a batch of
images, its input's shape and its classes' names (the ``labels`` signature). What
``tfdp.predict`` classifies with, and what finds a run's most confident mistakes
(``tfdp.training.mistakes``).
"""

import os

import numpy as np

from tfdp.util.errors import UserError


class Exported:
    """An export's serving signature: its input's shape and its classes' names."""

    def __init__(self, export: str):
        import tensorflow as tf

        version = newest_version(export)
        loaded = tf.saved_model.load(version)
        self._serve = loaded.signatures["serving_default"]
        self.shape = tuple(self._serve.structured_input_signature[1]["images"].shape[1:])
        labels = loaded.signatures.get("labels")
        self.class_names = ([n.decode() for n in labels()["class_names"].numpy()] if labels
                            else [str(k) for k in range(self._serve.structured_outputs[
                                "probabilities"].shape[-1])])

    def probabilities(self, images: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        return self._serve(images=tf.constant(images))["probabilities"].numpy()


def newest_version(export: str) -> str:
    """``export`` if it is a version (holds saved_model.pb), else its newest version."""
    if os.path.isfile(os.path.join(export, "saved_model.pb")):
        return export
    versions = sorted((int(v) for v in (os.listdir(export) if os.path.isdir(export) else ())
                       if v.isdigit() and os.path.isfile(os.path.join(export, v,
                                                                      "saved_model.pb"))))
    if not versions:
        raise UserError(f"{export} is no export: give a folder tfdp.train exported into "
                        "(saved_models/lenet) or one of its versions (saved_models/lenet/1)")
    return os.path.join(export, str(versions[-1]))
