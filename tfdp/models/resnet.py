"""The textbook's ResNet-18 variant for 28x28 inputs, as a Keras model built from a stage table.

Stem: 3x3 conv, stride 1, 64 channels, batch norm, ReLU (no max-pool: the images are small).
Four stages of two residual blocks (64, 128, 256, 512 channels); the first block of a stage
halves the resolution (except in stage one) and a 1x1 projection matches the shortcut's shape.
Global average pooling and a dense layer to 10 classes. About 11.2 million weights.
"""

import keras

# (channels, blocks, stride of the first block)
RESNET18_STAGES = ((64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2))


def _batch_norm(synchronized):
    return keras.layers.BatchNormalization(synchronized=synchronized)


def residual_block(x, channels, stride, synchronized):
    """conv-bn-relu-conv-bn plus the shortcut (projected by a 1x1 conv when shapes differ)."""
    y = keras.layers.Conv2D(channels, 3, strides=stride, padding="same")(x)
    y = keras.layers.ReLU()(_batch_norm(synchronized)(y))
    y = _batch_norm(synchronized)(keras.layers.Conv2D(channels, 3, padding="same")(y))
    if stride != 1 or x.shape[-1] != channels:
        x = keras.layers.Conv2D(channels, 1, strides=stride)(x)
    return keras.layers.ReLU()(keras.layers.Add()([x, y]))


def resnet(stages=RESNET18_STAGES, num_classes=10, sync_batch_norm=False, name="resnet18"):
    """A ResNet from a stage table, taking float images [n, 28, 28, 1] in [0, 1].

    ``sync_batch_norm`` computes batch statistics over the global batch, across replicas.
    """
    inputs = keras.Input((28, 28, 1))
    x = keras.layers.Conv2D(64, 3, padding="same")(inputs)
    x = keras.layers.ReLU()(_batch_norm(sync_batch_norm)(x))
    for channels, blocks, stride in stages:
        for block in range(blocks):
            x = residual_block(x, channels, stride if block == 0 else 1, sync_batch_norm)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name=name)
