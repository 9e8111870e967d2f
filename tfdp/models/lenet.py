"""The textbook's LeNet, NHWC, as plain tensors and as a Keras twin.

conv 3x3x20 -> relu -> avg-pool 2 -> conv 5x5x50 -> relu -> avg-pool 2 -> dense 128 -> relu
-> dense 10. For Fashion-MNIST's 28x28x1, 28 -> 26 -> 13 -> 9 -> 4, so the flattened features
are 4*4*50 = 800; other data's shape and classes give W1's input channels, W3's rows and W4's
columns (``shapes``).
Both forms use the same parameter shapes and flatten order (H, W, C), so weights move between
them unchanged (``to_keras_weights`` / ``from_keras_weights``).

``lenet_bn`` (``batch_norm=True``): the same layers with batch normalization after each
convolution and the hidden dense layer, before the ReLU, as the book's section on batch
normalization places it; those layers lose their bias (BN's beta takes its place). Each BN has
a scale ``g``, an offset ``be`` and running statistics ``mm``/``mv`` (Keras' ``moving_mean``
and ``moving_variance``; ``BN_MOMENTUM``, ``BN_EPSILON``), which are parameters of the model but not
trained by gradients (``STATISTICS``).
"""

import functools
import zipfile

import numpy as np
import tensorflow as tf

from tfdp.data.pipeline import to_float
from tfdp.models import lenet_batch_norm as batch_norm
from tfdp.models.lenet_batch_norm import BN_EPSILON, BN_MOMENTUM
from tfdp.util.errors import UserError

PARAM_SHAPES = {
    "W1": (3, 3, 1, 20), "b1": (20,),
    "W2": (5, 5, 20, 50), "b2": (50,),
    "W3": (800, 128), "b3": (128,),
    "W4": (128, 10), "b4": (10,),
}
# lenet_bn, in Keras' order (a layer's kernel, then its BN's gamma, beta, mean, variance).
BN_PARAM_SHAPES = {
    **{name: shape for layer, width in ((1, 20), (2, 50), (3, 128))
       for name, shape in ((f"W{layer}", PARAM_SHAPES[f"W{layer}"]), (f"g{layer}", (width,)),
                           (f"be{layer}", (width,)), (f"mm{layer}", (width,)),
                           (f"mv{layer}", (width,)))},
    "W4": (128, 10), "b4": (10,),
}
STATISTICS = ("mm1", "mv1", "mm2", "mv2", "mm3", "mv3")


FASHION_MNIST = ((28, 28, 1), 10)


def shapes(batch_norm: bool = False, input_shape: tuple = FASHION_MNIST[0],
           num_classes: int = FASHION_MNIST[1]) -> dict:
    """Every parameter's shape, in Keras' order: LeNet's, or lenet_bn's, for images of
    ``input_shape`` in ``num_classes`` classes."""
    named = BN_PARAM_SHAPES if batch_norm else PARAM_SHAPES
    if (tuple(input_shape), num_classes) == FASHION_MNIST:
        return named
    height, width, channels = input_shape
    side = [((n - 2) // 2 - 4) // 2 for n in (height, width)]
    if min(side) < 1:
        raise UserError(f"LeNet needs images of at least 14x14 (two valid convolutions and two "
                        f"poolings), the data's are {height}x{width}: give --image_size")
    changed = {"W1": (3, 3, channels, 20), "W3": (side[0] * side[1] * 50, 128),
               "W4": (128, num_classes), "b4": (num_classes,)}
    return {name: changed.get(name, shape) for name, shape in named.items()}


def trainable(params: dict) -> dict:
    """The parameters gradients train (all but batch normalization's running statistics)."""
    return {name: value for name, value in params.items() if name not in STATISTICS}


def init_params(seed: int, dtype=np.float32, init: str = "textbook", batch_norm: bool = False,
                input_shape: tuple = FASHION_MNIST[0], num_classes: int = FASHION_MNIST[1]
                ) -> dict:
    """Starting parameters as numpy arrays; biases zero (lenet_bn: BN's scales and running
    variances one, its offsets and running means zero, as Keras starts them).

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

    def start(name, shape):
        if name.startswith("W"):
            return weight(shape)
        return np.ones(shape) if name.startswith(("g", "mv")) else np.zeros(shape)

    return {name: start(name, shape).astype(dtype)
            for name, shape in shapes(batch_norm, input_shape, num_classes).items()}


def start_params(init: str, seed: int, dtype=np.float32, batch_norm: bool = False,
                 input_shape: tuple = FASHION_MNIST[0], num_classes: int = FASHION_MNIST[1]
                 ) -> dict:
    """Starting parameters for ``--init``: a scheme name, or a .npz file holding W1..b4."""
    if batch_norm and init.endswith(".npz"):
        raise UserError(f"--init={init}: a .npz file holds LeNet's parameters W1..b4; "
                        "lenet_bn starts from --init=glorot or textbook")
    if not init.endswith(".npz"):
        return init_params(seed, dtype, init, batch_norm, input_shape, num_classes)
    return {name: value.astype(dtype) for name, value in
            load_npz(init, shapes(False, input_shape, num_classes)).items()}


def load_npz(path: str, needed: dict = PARAM_SHAPES) -> dict:
    """LeNet's parameters (of shapes ``needed``) from a ``numpy.savez`` file, each checked
    (one-line errors)."""
    needs = f"--init={path} needs a .npz file (numpy.savez) holding {', '.join(needed)}"
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        raise UserError(f"{needs}; this is a single .npy array renamed")
    if not magic.startswith(b"PK"):
        raise UserError(f"{needs}; this file is not a zip archive (text, or another format?)")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [name for name in needed if name not in f.files]
            if missing:
                raise UserError(f"{needs}; it lacks {', '.join(missing)}")
            params = {name: f[name] for name in needed}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"{needs}; it cannot be read ({type(e).__name__}: {e})") from None
    for name, shape in needed.items():
        if params[name].shape != shape:
            raise UserError(f"--init={path}: {name} has shape {params[name].shape}, LeNet needs "
                            f"{shape}")
        if not np.issubdtype(params[name].dtype, np.floating):
            raise UserError(f"--init={path}: {name} holds {params[name].dtype}, not floats")
        if not np.all(np.isfinite(params[name])):
            raise UserError(f"--init={path}: {name} holds NaN or infinite values")
    return params


def apply(params: dict, images: tf.Tensor, batch_stats: list = None) -> tf.Tensor:
    """Logits for float ``images`` [n, height, width, channels] in [0, 1]. lenet_bn normalizes
    with the running statistics, or, given a list ``batch_stats`` (training), with the batch's
    own, appending each layer's (mean, variance) to it."""
    def layer(h, i):
        if f"g{i}" not in params:
            return tf.nn.relu(h + params[f"b{i}"])
        return tf.nn.relu(batch_norm.normalized(h, params, i, batch_stats))

    if batch_stats is not None and "g1" in params and batch_norm.fused(images.dtype):
        h = tf.nn.relu(batch_norm.normalized_first_convolution(images, params, batch_stats))
    else:
        h = layer(tf.nn.conv2d(images, params["W1"], 1, "VALID"), 1)
    h = tf.nn.avg_pool2d(h, 2, 2, "VALID")
    h = tf.nn.avg_pool2d(layer(tf.nn.conv2d(h, params["W2"], 1, "VALID"), 2), 2, 2, "VALID")
    h = layer(tf.matmul(tf.reshape(h, [-1, params["W3"].shape[0]]), params["W3"]), 3)
    return tf.matmul(h, params["W4"]) + params["b4"]


def logits(params: dict, images, compute=None, batch_stats: list = None) -> tf.Tensor:
    """LeNet's logits for uint8 ``images``, in the parameters' dtype, computed in ``compute``
    (default: the parameters' dtype); ``batch_stats`` as ``apply``'s. Under mixed precision
    (bfloat16) the parameters are cast on the way in and the logits back, so the softmax and
    the loss are float32 and the gradients reach the float32 parameters through the casts
    (batch normalization computes in float32)."""
    dtype = params["W1"].dtype
    compute = tf.as_dtype(compute or dtype)
    if compute == dtype:
        return apply(params, to_float(images, dtype), batch_stats)
    low = {name: value if name in STATISTICS else tf.cast(value, compute)
           for name, value in params.items()}
    return tf.cast(apply(low, to_float(images, compute), batch_stats), dtype)


def moved_statistics(params: dict, batch_stats: list) -> dict:
    """lenet_bn's running statistics moved by one step's batch ``(mean, variance)`` per layer,
    as Keras moves them (``BN_MOMENTUM``): {name: new value}."""
    moved = {}
    for i, (mean, variance) in enumerate(batch_stats, start=1):
        for name, batch in ((f"mm{i}", mean), (f"mv{i}", variance)):
            old = params[name]
            moved[name] = old * BN_MOMENTUM + tf.cast(batch, old.dtype) * (1.0 - BN_MOMENTUM)
    return moved


def serving_model(params: dict, precision: str = "float32",
                  input_shape: tuple = FASHION_MNIST[0]):
    """The parameters (numpy) in the Keras twin, for ``tfdp.export.saved_model``: float32, or
    mixed bfloat16 like the training that made them."""
    model = keras_model(params["W4"].shape[1], "bfloat16" if precision == "bfloat16" else "float32",
                        batch_norm="g1" in params, input_shape=input_shape)
    model.set_weights(to_keras_weights(
        {name: np.asarray(value, np.float32) for name, value in params.items()}))
    return model


def keras_model(num_classes: int = 10, precision: str = "float32", batch_norm: bool = False,
                sync_batch_norm: bool = False, input_shape: tuple = (28, 28, 1)):
    """The Keras twin (Keras' default initializers), taking float images in [0, 1], in
    ``--precision`` (``tfdp.models.precision``); lenet_bn's with ``batch_norm`` (its running
    statistics one value across replicas, ``ReplicatedBatchNormalization``, or with
    ``sync_batch_norm`` its batch statistics the global batch's)."""
    import keras

    from tfdp.models.precision import keras_dtypes

    inputs, dtype, last = keras_dtypes(precision)
    if batch_norm:
        return _keras_bn_model(num_classes, inputs, dtype, last, sync_batch_norm, input_shape)
    return keras.Sequential([
        keras.Input(input_shape, dtype=inputs),
        keras.layers.Conv2D(20, 3, activation="relu", dtype=dtype),
        keras.layers.AveragePooling2D(2, dtype=dtype),
        keras.layers.Conv2D(50, 5, activation="relu", dtype=dtype),
        keras.layers.AveragePooling2D(2, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(128, activation="relu", dtype=dtype),
        keras.layers.Dense(num_classes, dtype=last),
    ], name="lenet")


def _keras_bn_model(num_classes, inputs, dtype, last, sync_batch_norm, input_shape):
    import keras

    from tfdp.models.replicated_batch_norm import ReplicatedBatchNormalization

    def normalized(layer):
        kind = (functools.partial(keras.layers.BatchNormalization, synchronized=True)
                if sync_batch_norm else ReplicatedBatchNormalization)
        norm = kind(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, dtype=dtype)
        return [layer, norm, keras.layers.ReLU(dtype=dtype)]

    return keras.Sequential([
        keras.Input(input_shape, dtype=inputs),
        *normalized(keras.layers.Conv2D(20, 3, use_bias=False, dtype=dtype)),
        keras.layers.AveragePooling2D(2, dtype=dtype),
        *normalized(keras.layers.Conv2D(50, 5, use_bias=False, dtype=dtype)),
        keras.layers.AveragePooling2D(2, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        *normalized(keras.layers.Dense(128, use_bias=False, dtype=dtype)),
        keras.layers.Dense(num_classes, dtype=last),
    ], name="lenet_bn")


def to_keras_weights(params: dict) -> list:
    """Parameters in the order ``keras_model().set_weights`` takes them."""
    return [np.asarray(params[name]) for name in shapes("g1" in params)]


def from_keras_weights(weights: list) -> dict:
    """The inverse of ``to_keras_weights``."""
    names = shapes(len(weights) == len(BN_PARAM_SHAPES))
    return dict(zip(names, (np.asarray(w) for w in weights)))
