"""lenet_bn's batch normalization (``tfdp.models.lenet``), as Keras' ``BatchNormalization``
computes it, in the fewest kernels this machine's TensorFlow runs fast: in training, the first
layer's folded into its convolution (``normalized_first_convolution``), the others' in oneDNN's
fused kernel where it is the faster, else in the moments' formula, which float64 (every
equivalence test) always takes."""

import tensorflow as tf

# Running statistics that follow the model within an epoch: at Keras' default momentum (0.99) a
# fast run's evaluations lagged its training by epochs (docs/time-to-accuracy.md).
BN_MOMENTUM, BN_EPSILON = 0.9, 1e-3
# oneDNN's fused kernel is slower than the moments' few kernels when the channels are not a
# multiple of this (lenet_bn's second layer, 50).
FUSED_CHANNELS = 4


def fused(compute) -> bool:
    """Whether training normalizes in fewer kernels than the moments' formula: in float32
    (bfloat16 normalizes in float32); float64 keeps the formula, which the fused kernels do
    not take."""
    return tf.as_dtype(compute) in (tf.float32, tf.bfloat16)


def normalized_first_convolution(images, params: dict, batch_stats: list):
    """Layer 1's convolution and training's batch normalization as one convolution. Each output
    channel is linear in its input patch, so its batch mean and variance are ``w . mu`` and
    ``w' S w`` from the patches' mean ``mu`` and covariance ``S`` (9 numbers a patch of LeNet's
    first layer, against 20 channels at 676 positions), and normalizing it is convolving with
    the kernel scaled by ``gamma / sigma`` and adding ``beta - mean gamma / sigma``: oneDNN's
    one kernel with the ReLU, and no batch-normalization gradient over the largest activations
    (docs/time-to-accuracy.md#the-fast-step). The moments' formula, rounded differently; the
    statistics in float32, of the pixels the convolution sees."""
    kernel = params["W1"]
    kh, kw, cin, cout = kernel.shape
    size = kh * kw * cin
    # Every position's patch, through a convolution with one-hot kernels.
    one_hot = tf.reshape(tf.eye(size), [kh, kw, cin, size])
    patches = tf.reshape(tf.nn.conv2d(tf.cast(images, tf.float32), one_hot, 1, "VALID"),
                         [-1, size])
    count = tf.cast(tf.shape(patches)[0], tf.float32)
    mu = tf.reduce_mean(patches, 0, keepdims=True)
    covariance = (tf.matmul(patches, patches, transpose_a=True) / count
                  - tf.matmul(mu, mu, transpose_a=True))
    w = tf.reshape(tf.cast(kernel, tf.float32), [size, cout])
    mean = tf.matmul(mu, w)[0]
    variance = tf.reduce_sum(w * tf.matmul(covariance, w), 0)
    batch_stats.append((mean, variance))
    scale = tf.cast(params["g1"], tf.float32) * tf.math.rsqrt(variance + BN_EPSILON)
    shift = tf.cast(params["be1"], tf.float32) - mean * scale
    compute = images.dtype
    return tf.nn.bias_add(tf.nn.conv2d(images, kernel * tf.cast(scale, compute), 1, "VALID"),
                          tf.cast(shift, compute))


def normalized(h, params: dict, i: int, batch_stats: list = None):
    """Keras' BatchNormalization of layer ``i``, computed in at least float32 as Keras does;
    training's in one fused kernel where there is one (float32) and it is the faster: oneDNN's
    is slower than the moments' few kernels when the channels are not a multiple of
    ``FUSED_CHANNELS`` (lenet_bn's 50; docs/time-to-accuracy.md#the-fast-step)."""
    compute = h.dtype
    wide = tf.float64 if compute == tf.float64 else tf.float32
    h = tf.cast(h, wide)
    if batch_stats is not None and fused(wide) and h.shape[-1] % FUSED_CHANNELS == 0:
        return tf.cast(_fused_batch_norm(h, params, i, batch_stats), compute)
    return tf.cast(_moments_batch_norm(h, params, i, batch_stats), compute)


def _moments_batch_norm(h, params: dict, i: int, batch_stats: list = None):
    """Batch normalization as Keras writes it: the running statistics, or the batch's own
    moments (appended to ``batch_stats``)."""
    if batch_stats is None:
        mean, variance = params[f"mm{i}"], params[f"mv{i}"]
    else:
        mean, variance = tf.nn.moments(h, list(range(len(h.shape) - 1)))
        batch_stats.append((mean, variance))
    wide = h.dtype
    return tf.nn.batch_normalization(h, tf.cast(mean, wide), tf.cast(variance, wide),
                                     tf.cast(params[f"be{i}"], wide),
                                     tf.cast(params[f"g{i}"], wide), BN_EPSILON)


def _fused_batch_norm(h, params: dict, i: int, batch_stats: list):
    """Training's batch normalization of float32 ``h`` in one kernel (``FusedBatchNormV3``):
    ``_moments_batch_norm``'s value, in fewer passes over the activations (the moments path
    stays for float64, which the kernel does not take)."""
    shape = tf.shape(h)
    flat = len(h.shape) == 2
    if flat:  # The fused kernel takes NHWC only: a dense layer's [n, c] as [n, 1, 1, c].
        h = h[:, tf.newaxis, tf.newaxis, :]
    out, mean, variance = tf.compat.v1.nn.fused_batch_norm(
        h, tf.cast(params[f"g{i}"], tf.float32), tf.cast(params[f"be{i}"], tf.float32),
        epsilon=BN_EPSILON, is_training=True)
    # The kernel's variance is Bessel-corrected (n - 1); Keras moves its statistics by the
    # batch's own (n), as the moments path does.
    n = tf.cast(tf.size(h) // tf.shape(h)[-1], tf.float32)
    batch_stats.append((mean, variance * tf.maximum(n - 1, 0.0) / n))
    return tf.reshape(out, shape) if flat else out
