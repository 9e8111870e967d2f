"""Serve one export with TensorFlow's own clients, in a process that never imports tfdp.

  python tests/serving_clients.py <images.npy> <labels.npy> \
      <export dir>[=<margin>[=<n>[=<its images.npy>=<its labels.npy>]]] ...

Prints one JSON object, for each export folder what its clients saw: each client's accuracy on
the given examples (NaN where it names a class otherwise than TF2 does), the class names TF2
gave, and the signature it saw (one process for every export: each process pays
TensorFlow's start).
Clients: the TF1 session loader (``tf.compat.v1.saved_model.loader``: the C++
``SavedModelBundle`` path TF Serving takes), the ``saved_model_cli run`` command, TF2's
``tf.saved_model.load``, Keras' ``TFSMLayer``; and, for the other formats the version holds,
ONNX Runtime on ``model.onnx`` and LiteRT's interpreter (``ai-edge-litert``, not the deprecated
``tf.lite.Interpreter``) on ``model.tflite``, each with its classes and its logits' largest
difference from TF2's, relative to their size.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf


def tf1_session(path, images):
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
        signature = meta.signature_def["serving_default"]
        feed = {signature.inputs["images"].name: images}
        classes, names = session.run([signature.outputs["classes"].name,
                                      signature.outputs["class_names"].name], feed)
        seen = {"inputs": {k: [tf.dtypes.as_dtype(v.dtype).name,
                               [d.size for d in v.tensor_shape.dim]]
                           for k, v in signature.inputs.items()},
                "outputs": {k: [tf.dtypes.as_dtype(v.dtype).name,
                                [d.size for d in v.tensor_shape.dim]]
                            for k, v in signature.outputs.items()}}
    return (classes, names), seen


def saved_model_cli(path, images_file, as_command=True):
    """``saved_model_cli run``'s answer: the command itself, or (``as_command`` False) its run
    in this process, without the command's own TensorFlow start (its inputs read and its
    session run by the command's own functions)."""
    outdir = tempfile.mkdtemp()
    if as_command:
        cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
        subprocess.run([cli, "run", "--dir", path, "--tag_set", "serve",
                        "--signature_def", "serving_default", "--inputs",
                        f"images={images_file}", "--outdir", outdir],
                       check=True, capture_output=True, timeout=300)
    else:
        from tensorflow.python.tools import saved_model_cli as command

        inputs = command.load_inputs_from_input_arg_string(f"images={images_file}", "", "")
        with contextlib.redirect_stdout(io.StringIO()):  # It prints every output; JSON is ours.
            command.run_saved_model_with_feed_dict(path, "serve", "serving_default", inputs,
                                                   outdir, False)
    return (np.load(os.path.join(outdir, "classes.npy")),
            np.load(os.path.join(outdir, "class_names.npy"), allow_pickle=True))


# Logits whose top two differ by less than this share of their size are a tie that rounding
# (another client's kernels, another device count) may break either way.
TIE = 1e-4


def tf2_loader(path, images, margin=TIE):
    """(classes, whether every logit is finite, how many examples' top two logits tie, how many
    are within ``margin`` of their size of each other)."""
    serve = tf.saved_model.load(path).signatures["serving_default"]
    out = serve(images=tf.constant(images))
    logits = out["logits"].numpy()
    top2 = np.sort(logits, axis=-1)[:, -2:]
    scale = np.maximum(1.0, np.abs(logits).max(axis=-1))
    ties = int(np.sum(top2[:, 1] - top2[:, 0] < TIE * scale))
    near = int(np.sum(top2[:, 1] - top2[:, 0] < 2 * margin * scale))
    return ((out["classes"].numpy(), out["class_names"].numpy()),
            bool(np.all(np.isfinite(logits))), ties, near)


def tfsm_layer(path, images):
    import keras

    layer = keras.layers.TFSMLayer(path, call_endpoint="serving_default")
    out = layer(tf.constant(images))
    return np.asarray(out["classes"]), np.asarray(out["class_names"])


def onnx_runtime(path, images):
    """(outputs by name, the contract as ONNX Runtime sees it)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(os.path.join(path, "model.onnx"),
                                           providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    seen = {"inputs": {i.name: i.type for i in session.get_inputs()},
            "outputs": {o.name: o.type for o in session.get_outputs()},
            "class_names": json.loads(session.get_modelmeta().custom_metadata_map.get(
                "class_names", "null"))}
    return dict(zip(names, session.run(None, {"images": images}))), seen


def litert(path, images):
    """(outputs by name, the contract as LiteRT's signature runner sees it, the file's size)."""
    from ai_edge_litert.interpreter import Interpreter

    model = os.path.join(path, "model.tflite")
    runner = Interpreter(model_path=model).get_signature_runner("serving_default")
    seen = {"inputs": {k: [np.dtype(v["dtype"]).name, v["shape_signature"].tolist()]
                       for k, v in runner.get_input_details().items()},
            "outputs": {k: np.dtype(v["dtype"]).name
                        for k, v in runner.get_output_details().items()},
            "class_names": litert_metadata(model).get("class_names")}
    return runner(images=images), seen, os.path.getsize(model)


def litert_metadata(model: str) -> dict:
    """The model's own metadata table (``Model.metadata``) as LiteRT's flatbuffer tools read
    it: {name: the JSON its buffer holds}, for the entries that hold JSON."""
    from ai_edge_litert.tools import flatbuffer_utils

    read = flatbuffer_utils.read_model(model)
    found = {}
    for entry in read.metadata or []:
        try:
            found[entry.name.decode()] = json.loads(bytes(read.buffers[entry.buffer].data))
        except ValueError:  # The converter's own entries are flatbuffers or version strings.
            pass
    return found


def relative(logits, reference) -> float:
    """Largest |logits - reference|, relative to the reference's largest (at least 1)."""
    return float(np.abs(np.asarray(logits) - reference).max()
                 / max(1.0, float(np.abs(reference).max())))


def main(images_file, labels_file, *exports):
    """Each of ``exports`` is a folder, then optionally ``=margin``: how far (relative) ONNX's
    and LiteRT's logits may be from TF2's (examples whose top two TF2 logits are within twice
    that may change class), ``=n``: served on the first n examples only, and two files: its
    own examples (data of another shape) instead of the first two arguments'."""
    seen = {}
    for export in exports:
        path, margin, count, *own = export.split("=") + [""] * 4
        images, labels = (own[:2] if own[0] else (images_file, labels_file))
        if count:
            folder = tempfile.mkdtemp()
            images, labels = (os.path.join(folder, name) for name in ("images.npy", "labels.npy"))
            np.save(images, np.load(own[0] or images_file)[:int(count)])
            np.save(labels, np.load(own[1] or labels_file)[:int(count)])
        # The command once per process (each one pays TensorFlow's start), then its run here.
        seen[path] = serve(path, images, labels, margin or str(TIE), as_command=not seen)
    print(json.dumps(seen))


def serve(path, images_file, labels_file, margin=str(TIE), as_command=True) -> dict:
    """What every client sees of the export ``path`` (``as_command``: saved_model_cli's)."""
    images, labels = np.load(images_file), np.load(labels_file)

    names_by_class = {}

    def accuracy(answer):
        """The share of ``labels`` that (classes, class names) ``answer`` gives, each class
        named as TF2 names it (else the accuracy is NaN)."""
        classes, names = (np.asarray(a).reshape(-1) for a in answer)
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        for c, name in zip(classes.tolist(), names):
            if names_by_class.setdefault(c, name) != name:
                return float("nan")
        return float(np.mean(classes == labels))

    tf2_answer, logits_finite, ties, near = tf2_loader(path, images, float(margin))
    tf2_classes = tf2_answer[0]
    tf1_answer, signature = tf1_session(path, images)
    reference = tf.saved_model.load(path).signatures["serving_default"](
        images=tf.constant(images))["logits"].numpy()
    seen = {
        "signature": signature,
        "tf2_loader": accuracy(tf2_answer),
        "tf1_session": accuracy(tf1_answer),
        "saved_model_cli": accuracy(saved_model_cli(path, images_file, as_command)),
        "logits_finite": logits_finite,
        "ties": ties,
        "near_ties": near,
        "tfsm_layer": accuracy(tfsm_layer(path, images)),
    }
    if os.path.exists(os.path.join(path, "model.onnx")):
        outputs, contract = onnx_runtime(path, images)
        seen.update(onnx_runtime=accuracy((outputs["classes"], outputs["class_names"])),
                    onnx_signature=contract,
                    onnx_logits=relative(outputs["logits"], reference),
                    onnx_same_classes=float(np.mean(outputs["classes"] == tf2_classes)))
    if os.path.exists(os.path.join(path, "model.tflite")):
        outputs, contract, size = litert(path, images)
        seen.update(litert=accuracy((outputs["classes"], outputs["class_names"])),
                    litert_signature=contract,
                    litert_logits=relative(outputs["logits"], reference), litert_bytes=size,
                    litert_same_classes=float(np.mean(outputs["classes"] == tf2_classes)))
    seen["names_by_class"] = {str(c): name for c, name in sorted(names_by_class.items())}
    with open(os.path.join(path, "assets", "labels.txt"), encoding="utf-8") as f:
        seen["labels_txt"] = f.read().splitlines()
    labels = tf.saved_model.load(path).signatures["labels"]()["class_names"].numpy()
    seen["labels_signature"] = [n.decode() for n in labels]
    return seen


if __name__ == "__main__":
    main(*sys.argv[1:])
