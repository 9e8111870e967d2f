"""Exports beside the SavedModel (``--export_formats``): the same model, the same serving contract,
for the runtimes users serve with.

* ``onnx``: ``model.onnx``, converted from the SavedModel's ``serving_default`` by ``tf2onnx``
  (``pip install tfdp[onnx]``). ONNX carries the contract whole: input ``images`` uint8
  ``[N, 28, 28, 1]``; outputs ``logits`` and ``probabilities`` float32 ``[N, 10]``, ``classes``
  int64 ``[N]``, ``class_names`` string ``[N]``. The batch dimension is named ``unk__<n>`` by
  the converter.
* ``litert``: ``model.tflite``, a LiteRT flatbuffer converted from the SavedModel by
  TensorFlow's converter, run by ``ai-edge-litert``'s interpreter (``pip install tfdp[litert]``),
  which replaces ``tf.lite.Interpreter`` (tensorflow/tensorflow#102071). Its signature runner
  ``serving_default`` carries the same names and dtypes; the input's shape is ``[1, 28, 28, 1]``
  with the batch dimension free (``shape_signature`` ``[-1, 28, 28, 1]``), and the runner
  resizes it to each call's batch.

A model trained in bfloat16 serves its SavedModel in bfloat16 (mixed precision, as it
trained), which neither converter takes (LiteRT has no bfloat16 convolution; tf2onnx would
leave casts ONNX Runtime's CPU kernels do not run); one trained in float64 computes in float64,
which LiteRT's builtin kernels do not take either. Their ONNX and LiteRT files are converted
from a float32 twin with the same weights instead (float64 weights rounded to float32): they
compute in float32, and their logits differ from the SavedModel's by float32's rounding
(float64 models) or by the SavedModel's bfloat16 rounding. Rounding every
layer's inputs to bfloat16's 8 significant bits (unit roundoff u = 2^-8) in LeNet's four
weighted layers bounds that difference, to first order, by about 4·2u = 2^-5 ≈ 3 % of the
logits' size (two roundings a layer: weights and activations); ``tests/test_serving_clients.py``
holds them to it and measures it.

Both files are written into the version's temporary folder before it is renamed into place, so
a version has all its formats or does not exist; ``python -m tfdp.export <version>
--formats=onnx,litert`` adds them to a version exported before.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys

from tfdp.util import logs
from tfdp.util.errors import UserError

FORMATS = ("saved_model", "onnx", "litert")
FILES = {"onnx": "model.onnx", "litert": "model.tflite"}
_NEEDS = {"onnx": (("tf2onnx", "onnx"), "pip install 'tfdp[onnx]'"),
          "litert": (("tensorflow.lite",), "a TensorFlow with tf.lite, or pip install "
                                            "'tfdp[litert]'")}


def parse(text: str, flag: str = "--export_formats") -> tuple:
    """``"saved_model,onnx"`` -> the formats, each known and its converter importable; the
    SavedModel always comes first (the others are converted from it)."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    unknown = [n for n in names if n not in FORMATS]
    if unknown or not names:
        raise UserError(f"{flag}={text}: give a comma-separated list of {', '.join(FORMATS)}")
    for name in names:
        if name in _NEEDS:
            modules, install = _NEEDS[name]
            missing = [m for m in modules if not _importable(m)]
            if missing:
                raise UserError(f"{flag}: {name} needs {', '.join(missing)}, which is not "
                                f"installed: {install}")
    return ("saved_model", *[n for n in dict.fromkeys(names) if n != "saved_model"])


def convert(version: str, formats: tuple, source: str = None) -> list:
    """Write ``formats`` (beyond the SavedModel) into the SavedModel folder ``version``,
    converted from ``source`` (another SavedModel of the same weights; default ``version``);
    return the files written."""
    written, names = [], None
    labels_txt = os.path.join(version, "assets", "labels.txt")
    if os.path.exists(labels_txt):
        with open(labels_txt, encoding="utf-8") as f:
            names = f.read().splitlines()
    for name in formats:
        if name == "saved_model":
            continue
        target = os.path.join(version, FILES[name])
        partial = target + ".partial"
        (_to_onnx if name == "onnx" else _to_litert)(source or version, partial)
        if names is not None:
            (_name_onnx_classes if name == "onnx" else _name_litert_classes)(partial, names)
        os.chmod(partial, 0o644)
        os.replace(partial, target)
        written.append(target)
    return written


def _to_onnx(saved_model: str, path: str) -> None:
    # tf2onnx's converter, in a process of its own: it imports TensorFlow's graph internals
    # and logs at INFO, neither of which belongs in the training process.
    done = subprocess.run(
        [sys.executable, "-m", "tf2onnx.convert", "--saved-model", saved_model,
         "--signature_def", "serving_default", "--output", path],
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if done.returncode != 0 or not os.path.exists(path):
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"tf2onnx could not convert {saved_model} to ONNX: {tail}")


def _name_onnx_classes(onnx_file: str, names: list) -> None:
    """The class names in the ONNX model's metadata (``class_names``: a JSON list in class
    order), where ONNX Runtime shows them (``session.get_modelmeta().custom_metadata_map``)."""
    import onnx

    model = onnx.load(onnx_file)
    entry = model.metadata_props.add()
    entry.key, entry.value = "class_names", json.dumps(names)
    onnx.save(model, onnx_file)


def _name_litert_classes(tflite_file: str, names: list) -> None:
    """The class names in the LiteRT model's own metadata table (``Model.metadata``: an entry
    ``class_names`` whose buffer holds a JSON list in class order, beside the converter's
    ``min_runtime_version``), read with the schema TensorFlow ships. TFLite Support's metadata
    (``TFLITE_METADATA``, labels as an associated file) needs ``tflite-support``, whose last
    release requires protobuf < 4, which no TensorFlow 2 of today can share an environment
    with."""
    import flatbuffers
    import numpy as np
    import tensorflow as tf

    schema = _module_file(os.path.join(os.path.dirname(tf.__file__), "lite", "python",
                                       "schema_py_generated.py"))
    with open(tflite_file, "rb") as f:
        model = schema.ModelT.InitFromPackedBuf(bytearray(f.read()), 0)
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(json.dumps(names).encode(), np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name, entry.buffer = "class_names", len(model.buffers) - 1
    model.metadata = [*(model.metadata or []), entry]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    with open(tflite_file, "wb") as f:
        f.write(builder.Output())


def _module_file(path: str):
    """The Python module in ``path``, loaded by its file (TensorFlow's ``tensorflow.lite`` is
    its public API's alias, which hides the package's own modules from ``import``)."""
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What the LiteRT converter writes to fd 2 on every conversion: its shared library's own copy
# of TensorFlow's start-up banners, and two warnings about options tf.lite itself passes.
_CONVERTER_LINES = re.compile(
    r"W\d{4} [\d:.]+ +\d+ tf_tfl_flatbuffer_helpers\.cc:\d+\] Ignored (output_format|"
    r"drop_control_dependency)\.$")


def _to_litert(saved_model: str, path: str) -> None:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model,
                                                         signature_keys=["serving_default"])
    with logs.known_lines_dropped(re.compile(
            f"{_CONVERTER_LINES.pattern}|{logs.STARTUP_BANNERS.pattern}")):
        flatbuffer = converter.convert()
    with open(path, "wb") as f:
        f.write(flatbuffer)


def _importable(module: str) -> bool:
    """Whether ``module`` is installed, without importing it or its parents: ``find_spec`` of
    a dotted name imports the package, and importing TensorFlow here, while the flags are
    checked, would print its start-up banners before tfdp hides them (``tfdp.util.logs``)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    if not spec.submodule_search_locations:
        return False
    path = os.path.join(next(iter(spec.submodule_search_locations)), *rest)
    return os.path.isdir(path) or os.path.isfile(path + ".py")
