"""SavedModel export with one serving contract for every path and model.

Contract (signature ``serving_default``), for images of H x W x C in K classes (Fashion-MNIST:
28 x 28 x 1, 10):
  input   ``images``         uint8   [None, H, W, C]  raw pixels, as the data holds them
  outputs ``logits``         float32 [None, K]
          ``probabilities``  float32 [None, K]
          ``classes``        int64   [None]
          ``class_names``    string  [None]           each class's name (TFDS' label names, or
                                                      an image folder's class folders)

and the class names themselves, in class order: the asset ``assets/labels.txt`` (one name a
line, as TF Serving users and model zoos read it) and the signature ``labels`` (no inputs;
output ``class_names`` string [K]).

With ``--eval_flip`` the logits are the mean of the image's and its mirror image's, as the
run evaluated them: what is served scores what the run reported.

Every path exports a Keras model (the manual path its parameters in LeNet's Keras twin) through
Keras' own ``ExportArchive``. A Keras 3 model wrapped in a ``tf.Module`` and saved with
``tf.saved_model.save`` carries every variable twice; TF2's loader copes, but the TF1/C++
loader (TF Serving, ``saved_model_cli run``) fails with "Could not find variable" and the TFLite
converter yields a model without weights (keras-team/keras#20095, tensorflow/serving#2250).
``tests/test_serving_clients.py`` loads every path's export with those clients.

Each export is a new version ``<export_root>/<n>/`` (1, 2, ... as TF Serving expects), readable
by every user (a model server often runs as another). It is written to a hidden temporary
folder beside it and renamed into place, so a crash never leaves a half-written version and
never touches an earlier one; a temporary folder whose writer was killed is removed by the next
export. The other formats a run asks for (``--export_formats``: ONNX, LiteRT) are converted
from the SavedModel into the same temporary folder (``tfdp.export.formats``), so a version
holds all of them or does not exist.
"""

import os
import re
import shutil
import socket
import tempfile

import keras
import tensorflow as tf

from tfdp.data import pipeline
from tfdp.export import formats
from tfdp.models.loss import test_logits
from tfdp.util.errors import UserError
from tfdp.util.files import process_alive

SIGNATURE = "serving_default"
# The class names in class order: an asset of every version, one a line, and the signature
# (no inputs) that returns them.
LABELS, LABELS_SIGNATURE = "labels.txt", "labels"
# A version is written in "<export_root>/.partial-<host>-<pid>-<random>" and renamed into place.
_PARTIAL = ".partial-"
_PARTIAL_NAME = re.compile(r"^\.partial-(?P<host>.+)-(?P<pid>\d+)-[^-]+$")


def write_archive(model: keras.Model, path: str, eval_flip: bool = False,
                  class_names=None) -> None:
    """``model`` (float images in [0, 1] -> logits) written to ``path`` behind the serving
    contract (with ``eval_flip``, averaged with its logits of the mirror images), naming each
    class by ``class_names`` (default: their numbers); the images' shape is the model's
    input's. The names travel as the asset ``labels.txt`` (one a line, in class order), which
    the ``labels`` signature reads."""
    archive = keras.export.ExportArchive()
    archive.track(model)
    if class_names is None:
        class_names = [str(k) for k in range(model.outputs[0].shape[-1])]
    names = tf.constant(list(class_names), tf.string)
    scratch = tempfile.mkdtemp(prefix="tfdp-labels-")
    try:
        labels_txt = os.path.join(scratch, LABELS)
        with open(labels_txt, "w", encoding="utf-8") as f:
            f.write("".join(f"{name}\n" for name in class_names))
        # A table read from labels.txt: the archive keeps a table's file as an asset.
        table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
            labels_txt, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER, tf.string,
            tf.lookup.TextFileIndex.WHOLE_LINE), default_value="")
        archive.track(table)

        # The serving signature names classes from a constant, not the table: the ONNX and
        # LiteRT converters take no lookup tables.
        def serve(images):
            logits = tf.cast(test_logits(lambda x: model(x, training=False),
                                         pipeline.to_float(images), eval_flip), tf.float32)
            classes = tf.argmax(logits, axis=-1, output_type=tf.int64)
            return {"logits": logits,
                    "probabilities": tf.nn.softmax(logits),
                    "classes": classes,
                    "class_names": tf.gather(names, classes)}

        def labels():
            return {"class_names": table.lookup(tf.range(len(class_names), dtype=tf.int64))}

        images = tf.TensorSpec([None, *model.inputs[0].shape[1:]], tf.uint8, name="images")
        archive.add_endpoint(SIGNATURE, serve, input_signature=[images])
        archive.add_endpoint(LABELS_SIGNATURE, labels, input_signature=[])
        archive.write_out(path, verbose=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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


def export(model: keras.Model, export_root: str, formats_csv: str = "saved_model",
           float32_twin=None, eval_flip: bool = False,
           class_names=None) -> str:
    """Save ``model`` as the next version under ``export_root``, with the other
    ``formats_csv`` (``tfdp.export.formats``) inside it, converted from ``float32_twin()``
    (the same weights computing in float32) when ``model`` computes in bfloat16 or float64;
    return its path."""
    check_export_root(export_root)
    remove_stale_partials(export_root)
    tmp = tempfile.mkdtemp(prefix=f"{_PARTIAL}{socket.gethostname()}-{os.getpid()}-",
                           dir=export_root)
    twin = None
    try:
        write_archive(model, tmp, eval_flip, class_names)
        wanted = tuple(formats_csv.split(","))
        if len(wanted) > 1 and any(layer.dtype_policy.compute_dtype != "float32"
                                   for layer in model.layers):
            twin = tempfile.mkdtemp(prefix="tfdp-float32-twin-")
            write_archive(float32_twin(), twin, eval_flip, class_names)
        formats.convert(tmp, wanted, source=twin)
        _readable_by_all(tmp)
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
        if twin:
            shutil.rmtree(twin, ignore_errors=True)


def remove_stale_partials(export_root: str) -> list:
    """Remove temporary export folders whose writer has gone (killed while exporting): on this
    host, known by its pid. Folders of other hosts sharing the root are left to them."""
    removed = []
    for name in os.listdir(export_root):
        match = _PARTIAL_NAME.match(name)
        if match and match["host"] == socket.gethostname() and not process_alive(int(match["pid"])):
            shutil.rmtree(os.path.join(export_root, name), ignore_errors=True)
            removed.append(name)
    return removed


def save_scratch(model: keras.Model, path: str, eval_flip: bool = False,
                 class_names=None) -> None:
    """Save to a throwaway ``path`` (non-chief workers must take part in saving, then delete)."""
    try:
        write_archive(model, path, eval_flip, class_names)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _readable_by_all(root: str) -> None:
    """Folders 0755 and files 0644: ``mkdtemp`` makes 0700, which a server of another user
    cannot read."""
    os.chmod(root, 0o755)
    for folder, subfolders, files in os.walk(root):
        for name in subfolders:
            os.chmod(os.path.join(folder, name), 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
