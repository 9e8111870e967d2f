"""Serve one export with TensorFlow's own clients, in a process that never imports tfdp.

  python tests/serving_clients.py <export dir> <images.npy> <labels.npy>

Prints one JSON object: each client's accuracy on the given examples and the signature it saw.
Clients: the TF1 session loader (``tf.compat.v1.saved_model.loader``: the C++
``SavedModelBundle`` path TF Serving takes), the ``saved_model_cli run`` command, TF2's
``tf.saved_model.load``, Keras' ``TFSMLayer``, and the TFLite converter and interpreter.
"""

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
        classes = session.run(signature.outputs["classes"].name, feed)
        seen = {"inputs": {k: [tf.dtypes.as_dtype(v.dtype).name,
                               [d.size for d in v.tensor_shape.dim]]
                           for k, v in signature.inputs.items()},
                "outputs": {k: [tf.dtypes.as_dtype(v.dtype).name,
                                [d.size for d in v.tensor_shape.dim]]
                            for k, v in signature.outputs.items()}}
    return classes, seen


def saved_model_cli(path, images_file):
    outdir = tempfile.mkdtemp()
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    subprocess.run([cli, "run", "--dir", path, "--tag_set", "serve",
                    "--signature_def", "serving_default", "--inputs", f"images={images_file}",
                    "--outdir", outdir], check=True, capture_output=True, timeout=300)
    return np.load(os.path.join(outdir, "classes.npy"))


# Logits whose top two differ by less than this share of their size are a tie that rounding
# (another client's kernels, another device count) may break either way.
TIE = 1e-4


def tf2_loader(path, images):
    """(classes, whether every logit is finite, how many examples' top two logits tie)."""
    serve = tf.saved_model.load(path).signatures["serving_default"]
    out = serve(images=tf.constant(images))
    logits = out["logits"].numpy()
    top2 = np.sort(logits, axis=-1)[:, -2:]
    scale = np.maximum(1.0, np.abs(logits).max(axis=-1))
    ties = int(np.sum(top2[:, 1] - top2[:, 0] < TIE * scale))
    return out["classes"].numpy(), bool(np.all(np.isfinite(logits))), ties


def tfsm_layer(path, images):
    import keras

    layer = keras.layers.TFSMLayer(path, call_endpoint="serving_default")
    return np.asarray(layer(tf.constant(images))["classes"])


def tflite(path, images):
    model = tf.lite.TFLiteConverter.from_saved_model(path).convert()
    interpreter = tf.lite.Interpreter(model_content=model)
    runner = interpreter.get_signature_runner("serving_default")
    return runner(images=images)["classes"], len(model)


def main(path, images_file, labels_file):
    images, labels = np.load(images_file), np.load(labels_file)

    def accuracy(classes):
        return float(np.mean(np.asarray(classes).reshape(-1) == labels))

    tf1_classes, signature = tf1_session(path, images)
    lite_classes, lite_bytes = tflite(path, images)
    tf2_classes, logits_finite, ties = tf2_loader(path, images)
    print(json.dumps({
        "signature": signature,
        "tf1_session": accuracy(tf1_classes),
        "saved_model_cli": accuracy(saved_model_cli(path, images_file)),
        "tf2_loader": accuracy(tf2_classes),
        "logits_finite": logits_finite,
        "ties": ties,
        "tfsm_layer": accuracy(tfsm_layer(path, images)),
        "tflite": accuracy(lite_classes),
        "tflite_bytes": lite_bytes,
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
