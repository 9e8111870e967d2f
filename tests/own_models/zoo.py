"""Models as Keras users write them, for tests/test_zoo.py: the habits of Keras' guides
(Dropout, regularizers, a softmax head, a subclassed model, a small vision transformer,
GroupNormalization) and keras.applications' own models (weights=None). Each is a function of
(input_shape, num_classes), as --model takes it."""

import keras
from keras import layers


class Penalty(layers.Layer):
    """A layer that adds a loss of its own (``add_loss``): the mean square of its inputs."""

    def __init__(self, strength, **kwargs):
        super().__init__(**kwargs)
        self.strength = strength

    def call(self, x):
        self.add_loss(self.strength * keras.ops.mean(keras.ops.square(x)))
        return x


def regularized_cnn(input_shape, num_classes, strength=1e-2, dropout=0.0, normalized=False):
    """Kernel, bias and activity regularizers and an ``add_loss`` of its own; no randomness
    unless ``dropout``; batch normalization after the convolution where ``normalized``."""
    l2 = keras.regularizers.L2(strength) if strength else None
    inputs = keras.Input(input_shape)
    x = layers.Conv2D(8, 3, activation=None if normalized else "relu",
                      kernel_regularizer=l2)(inputs)
    if normalized:
        x = layers.ReLU()(layers.BatchNormalization(momentum=0.9)(x))
    x = layers.MaxPooling2D(2)(x)
    x = layers.Flatten()(x)
    x = layers.Dense(16, activation="relu", kernel_regularizer=l2, bias_regularizer=l2,
                     activity_regularizer=keras.regularizers.L1(strength) if strength else None)(x)
    if strength:
        x = Penalty(strength)(x)
    if dropout:
        x = layers.Dropout(dropout)(x)
    return keras.Model(inputs, layers.Dense(num_classes, kernel_regularizer=l2)(x),
                       name="regularized_cnn")


def regularized_dropout_cnn(input_shape, num_classes):
    return regularized_cnn(input_shape, num_classes, dropout=0.3)


def regularized_dropout_norm_cnn(input_shape, num_classes):
    return regularized_cnn(input_shape, num_classes, dropout=0.3, normalized=True)


def unregularized_cnn(input_shape, num_classes):
    """``regularized_cnn`` without its regularizers: the same weights at the start."""
    return regularized_cnn(input_shape, num_classes, strength=0)


def dropout_cnn(input_shape, num_classes):
    """Every kind of randomness Keras' layers keep a seed state for."""
    inputs = keras.Input(input_shape)
    x = layers.RandomFlip("horizontal")(inputs)
    x = layers.GaussianNoise(0.05)(x)
    x = layers.Conv2D(8, 3, activation="relu")(x)
    x = layers.SpatialDropout2D(0.1)(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Flatten()(x)
    x = layers.Dense(32, activation="relu")(x)
    x = layers.Dropout(0.5)(x)
    x = layers.GaussianDropout(0.1)(x)
    x = layers.AlphaDropout(0.1)(x)
    return keras.Model(inputs, layers.Dense(num_classes)(x), name="dropout_cnn")


def softmax_head(input_shape, num_classes):
    """The habit of most Keras tutorials: probabilities out."""
    return keras.Sequential([keras.Input(input_shape), layers.Flatten(),
                             layers.Dense(32, activation="relu"),
                             layers.Dense(num_classes, activation="softmax")], name="softmax_head")


def softmax_layer(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape), layers.Flatten(),
                             layers.Dense(num_classes), layers.Softmax()], name="softmax_layer")


def hidden_softmax(input_shape, num_classes):
    """A subclassed model whose call ends in a softmax no layer shows."""

    class Hidden(keras.Model):
        def __init__(self):
            super().__init__(name="hidden_softmax")
            self.flatten, self.dense = layers.Flatten(), layers.Dense(num_classes)

        def call(self, x):
            return keras.ops.softmax(self.dense(self.flatten(x)))

    return Hidden()


class DropoutBatchNormNet(keras.Model):
    """A subclassed model with Dropout and BatchNormalization, as Keras' guides write one."""

    def __init__(self, num_classes, **kwargs):
        super().__init__(**kwargs)
        self.conv = layers.Conv2D(16, 3, padding="same", use_bias=False)
        self.norm = layers.BatchNormalization(momentum=0.9)
        self.pool = layers.GlobalAveragePooling2D()
        self.drop = layers.Dropout(0.3)
        self.head = layers.Dense(num_classes)

    def call(self, x, training=False):
        x = keras.ops.relu(self.norm(self.conv(x), training=training))
        return self.head(self.drop(self.pool(x), training=training))


def subclassed(input_shape, num_classes):
    return DropoutBatchNormNet(num_classes, name="dropout_batch_norm_net")


def tiny_vit(input_shape, num_classes, patch=4, width=32, heads=2):
    """A vision transformer on patches (Keras' "Image classification with Vision
    Transformer", small): patches, a learned position embedding, LayerNormalization,
    MultiHeadAttention and Dropout."""

    class PositionEmbedding(layers.Layer):
        def build(self, shape):
            self.position = self.add_weight(shape=(1, shape[1], shape[2]),
                                            initializer="random_normal", name="position")

        def call(self, x):
            return x + self.position

    inputs = keras.Input(input_shape)
    x = layers.Conv2D(width, patch, strides=patch)(inputs)  # The patches, embedded.
    x = layers.Reshape((-1, width))(x)
    x = PositionEmbedding()(x)
    for _ in range(2):
        y = layers.LayerNormalization(epsilon=1e-6)(x)
        y = layers.MultiHeadAttention(heads, width // heads, dropout=0.1)(y, y)
        x = layers.Add()([x, y])
        y = layers.LayerNormalization(epsilon=1e-6)(x)
        y = layers.Dense(2 * width, activation="gelu")(y)
        y = layers.Dropout(0.1)(layers.Dense(width)(y))
        x = layers.Add()([x, y])
    x = layers.GlobalAveragePooling1D()(layers.LayerNormalization(epsilon=1e-6)(x))
    return keras.Model(inputs, layers.Dense(num_classes)(layers.Dropout(0.1)(x)),
                       name="tiny_vit")


def group_norm(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = layers.Conv2D(16, 3, padding="same")(inputs)
    x = layers.Activation("relu")(layers.GroupNormalization(groups=4)(x))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes)(x), name="group_norm")


def mobilenet_v3_small(input_shape, num_classes):
    return keras.applications.MobileNetV3Small(input_shape=input_shape, weights=None,
                                               classes=num_classes, minimalistic=True)


def efficientnet_b0(input_shape, num_classes):
    return keras.applications.EfficientNetB0(input_shape=input_shape, weights=None,
                                             classes=num_classes)


def resnet50_v2(input_shape, num_classes):
    return keras.applications.ResNet50V2(input_shape=input_shape, weights=None,
                                         classes=num_classes)
