"""The textbook's LeNet for 28x28x1 inputs, NHWC, as plain tensors and as a Keras twin.

conv 3x3x20 -> relu -> avg-pool 2 -> conv 5x5x50 -> relu -> avg-pool 2 -> dense 128 -> relu
-> dense 10. 28 -> 26 -> 13 -> 9 -> 4, so the flattened features are 4*4*50 = 800.
Both forms use the same parameter shapes and flatten order (H, W, C), so weights move between
them unchanged (``to_keras_weights`` / ``from_keras_weights``).
"""

import zipfile

import numpy as np
import tensorflow as tf

from tfdp.data import to_float
from tfdp.errors import UserError

PARAM_SHAPES = {
    "W1": (3, 3, 1, 20), "b1": (20,),
    "W2": (5, 5, 20, 50), "b2": (50,),
    "W3": (800, 128), "b3": (128,),
    "W4": (128, 10), "b4": (10,),
}


def init_params(seed: int, dtype=np.float32, init: str = "textbook") -> dict:
    """Starting parameters as numpy arrays; biases zero.

    ``textbook``: weights ``normal * 0.01``, as the book (the loss then sits at ln 10 for about
    an epoch before it falls). ``glorot``: Glorot-uniform, Keras' default, which learns at once.
    """
    rng = np.random.default_rng(seed)

    def weight(shape):
        if init == "textbook":
            return rng.standard_normal(shape) * 0.01
        receptive = int(np.prod(shape[:-2]))  # kh * kw for a conv kernel, 1 for a dense one
        limit = np.sqrt(6.0 / (receptive * (shape[-2] + shape[-1])))
        return rng.uniform(-limit, limit, shape)

    return {name: (weight(shape) if name.startswith("W") else np.zeros(shape)).astype(dtype)
            for name, shape in PARAM_SHAPES.items()}


def start_params(init: str, seed: int, dtype=np.float32) -> dict:
    """Starting parameters for ``--init``: a scheme name, or a .npz file holding W1..b4."""
    if not init.endswith(".npz"):
        return init_params(seed, dtype, init)
    return {name: value.astype(dtype) for name, value in load_npz(init).items()}


def load_npz(path: str) -> dict:
    """LeNet's parameters from a ``numpy.savez`` file, each checked (one-line errors)."""
    needs = f"--init={path} needs a .npz file (numpy.savez) holding {', '.join(PARAM_SHAPES)}"
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        raise UserError(f"{needs}; this is a single .npy array renamed")
    if not magic.startswith(b"PK"):
        raise UserError(f"{needs}; this file is not a zip archive (text, or another format?)")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [name for name in PARAM_SHAPES if name not in f.files]
            if missing:
                raise UserError(f"{needs}; it lacks {', '.join(missing)}")
            params = {name: f[name] for name in PARAM_SHAPES}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"{needs}; it cannot be read ({type(e).__name__}: {e})") from None
    for name, shape in PARAM_SHAPES.items():
        if params[name].shape != shape:
            raise UserError(f"--init={path}: {name} has shape {params[name].shape}, LeNet needs "
                            f"{shape}")
        if not np.issubdtype(params[name].dtype, np.floating):
            raise UserError(f"--init={path}: {name} holds {params[name].dtype}, not floats")
        if not np.all(np.isfinite(params[name])):
            raise UserError(f"--init={path}: {name} holds NaN or infinite values")
    return params


def apply(params: dict, images: tf.Tensor) -> tf.Tensor:
    """Logits for float ``images`` [n, 28, 28, 1] in [0, 1]."""
    h = tf.nn.relu(tf.nn.conv2d(images, params["W1"], 1, "VALID") + params["b1"])
    h = tf.nn.avg_pool2d(h, 2, 2, "VALID")
    h = tf.nn.relu(tf.nn.conv2d(h, params["W2"], 1, "VALID") + params["b2"])
    h = tf.nn.avg_pool2d(h, 2, 2, "VALID")
    h = tf.reshape(h, [-1, 800])
    h = tf.nn.relu(tf.matmul(h, params["W3"]) + params["b3"])
    return tf.matmul(h, params["W4"]) + params["b4"]


def logits(params: dict, images, compute=None) -> tf.Tensor:
    """LeNet's logits for uint8 ``images``, in the parameters' dtype, computed in ``compute``
    (default: the parameters' dtype). Under mixed precision (bfloat16) the parameters are cast
    on the way in and the logits back, so the softmax and the loss are float32 and the
    gradients reach the float32 parameters through the casts."""
    dtype = params["W1"].dtype
    compute = tf.as_dtype(compute or dtype)
    if compute == dtype:
        return apply(params, to_float(images, dtype))
    low = {name: tf.cast(value, compute) for name, value in params.items()}
    return tf.cast(apply(low, to_float(images, compute)), dtype)


def serving_model(params: dict, precision: str = "float32"):
    """The parameters (numpy) in the Keras twin, for ``tfdp.training.export``: float32, or
    mixed bfloat16 like the training that made them."""
    model = keras_model(precision="bfloat16" if precision == "bfloat16" else "float32")
    model.set_weights(to_keras_weights(
        {name: np.asarray(value, np.float32) for name, value in params.items()}))
    return model


def keras_model(num_classes: int = 10, precision: str = "float32"):
    """The Keras twin (Keras' default initializers), taking float images in [0, 1], in
    ``--precision`` (``tfdp.models.precision``)."""
    import keras

    from tfdp.models.precision import keras_dtypes

    inputs, dtype, last = keras_dtypes(precision)
    return keras.Sequential([
        keras.Input((28, 28, 1), dtype=inputs),
        keras.layers.Conv2D(20, 3, activation="relu", dtype=dtype),
        keras.layers.AveragePooling2D(2, dtype=dtype),
        keras.layers.Conv2D(50, 5, activation="relu", dtype=dtype),
        keras.layers.AveragePooling2D(2, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(128, activation="relu", dtype=dtype),
        keras.layers.Dense(num_classes, dtype=last),
    ], name="lenet")


def to_keras_weights(params: dict) -> list:
    """Parameters in the order ``keras_model().set_weights`` takes them."""
    return [np.asarray(params[name]) for name in PARAM_SHAPES]


def from_keras_weights(weights: list) -> dict:
    """The inverse of ``to_keras_weights``."""
    return dict(zip(PARAM_SHAPES, (np.asarray(w) for w in weights)))
