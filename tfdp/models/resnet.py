"""The textbook's ResNet-18 variant for 28x28 inputs, as a Keras model built from a stage table.

Stem: 3x3 conv, stride 1, 64 channels, batch norm, ReLU (no max-pool: the images are small).
Four stages of two residual blocks (64, 128, 256, 512 channels); the first block of a stage
halves the resolution (except in stage one) and a 1x1 projection matches the shortcut's shape.
Global average pooling and a dense layer to 10 classes. About 11.2 million weights.
"""

import keras

from tfdp.models.precision import keras_dtypes
from tfdp.models.replicated_batch_norm import ReplicatedBatchNormalization

# (channels, blocks, stride of the first block)
RESNET18_STAGES = ((64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2))


def resnet(stages=RESNET18_STAGES, num_classes=10, sync_batch_norm=False, name="resnet18",
           precision="float32", input_shape=(28, 28, 1)):
    """A ResNet from a stage table, taking float images of ``input_shape`` in [0, 1].

    ``sync_batch_norm`` computes batch statistics over the global batch, across replicas (the
    moving statistics are one value across replicas either way: ``replicated_batch_norm``);
    ``precision`` as ``--precision`` (``tfdp.models.precision``).
    """
    inputs_dtype, dtype, last = keras_dtypes(precision)

    def conv(channels, size, stride=1, padding="same"):
        return keras.layers.Conv2D(channels, size, strides=stride, padding=padding, dtype=dtype)

    def bn_relu(x):
        x = ReplicatedBatchNormalization(synchronized=sync_batch_norm, dtype=dtype)(x)
        return keras.layers.ReLU(dtype=dtype)(x)

    def residual_block(x, channels, stride):
        """conv-bn-relu-conv-bn plus the shortcut (a 1x1 projection when shapes differ)."""
        y = bn_relu(conv(channels, 3, stride)(x))
        y = ReplicatedBatchNormalization(synchronized=sync_batch_norm, dtype=dtype)(
            conv(channels, 3)(y))
        if stride != 1 or x.shape[-1] != channels:
            x = conv(channels, 1, stride, "valid")(x)
        return keras.layers.ReLU(dtype=dtype)(keras.layers.Add(dtype=dtype)([x, y]))

    inputs = keras.Input(input_shape, dtype=inputs_dtype)
    x = bn_relu(conv(64, 3)(inputs))
    for channels, blocks, stride in stages:
        for block in range(blocks):
            x = residual_block(x, channels, stride if block == 0 else 1)
    x = keras.layers.GlobalAveragePooling2D(dtype=dtype)(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, dtype=last)(x), name=name)
