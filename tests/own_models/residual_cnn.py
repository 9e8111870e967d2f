"""A user's own model, outside tfdp: a small residual CNN with batch normalization, as a
``function(input_shape, num_classes)`` returning a Keras model (``--model=FILE:function``)."""

import keras


def residual_cnn(input_shape, num_classes, normalized=True):
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=not normalized)(inputs)
    if normalized:
        x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    y = keras.layers.Conv2D(8, 3, padding="same")(x)
    x = keras.layers.ReLU()(keras.layers.Add()([x, y]))
    x = keras.layers.MaxPooling2D(4)(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="residual_cnn")


def residual_cnn_without_norm(input_shape, num_classes):
    return residual_cnn(input_shape, num_classes, normalized=False)


class Subclassed(keras.Model):
    """The same idea as a subclassed model: no inputs until it is called."""

    def __init__(self, num_classes):
        super().__init__(name="subclassed")
        self.conv = keras.layers.Conv2D(4, 3)
        self.norm = keras.layers.BatchNormalization()
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.out = keras.layers.Dense(num_classes)

    def call(self, x, training=False):
        return self.out(self.pool(keras.activations.relu(self.norm(self.conv(x),
                                                                   training=training))))


def subclassed(input_shape, num_classes):
    return Subclassed(num_classes)


def wrong_classes(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(num_classes + 1)])


def not_a_model(input_shape, num_classes):
    return "a string"

