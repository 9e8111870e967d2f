"""Your own Keras model through all of tfdp: a small residual CNN with batch normalization,
trained from scratch on two devices (the textbook's algorithm applied to a model it was not
written for), with the backups, the report and the export every run has.

    python examples/own_keras_model.py

or, the same model from the command line, on any path:

    python -m tfdp.train --model=examples/own_keras_model.py:small_resnet --num_gpus=2
    python -m tfdp.train --model=examples/own_keras_model.py:small_resnet --strategy=mirrored

A model is a function of the images' shape (H, W, C) and the number of classes that returns a
Keras model taking float images in [0, 1] and returning one logit per class
(docs/your-model.md). The data is prepared as for ``python -m tfdp.train``.
"""


def small_resnet(input_shape, num_classes):
    import keras  # Here, not above: tfdp starts TensorFlow first, without its start-up noise.

    def normalized(x):  # Running statistics that keep up with a short run: momentum 0.9.
        return keras.layers.BatchNormalization(momentum=0.9)(x)

    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU()(normalized(x))
    for channels in (16, 32):
        y = keras.layers.Conv2D(channels, 3, padding="same", use_bias=False)(x)
        y = keras.layers.ReLU()(normalized(y))
        y = normalized(keras.layers.Conv2D(channels, 3, padding="same", use_bias=False)(y))
        if x.shape[-1] != channels:
            x = keras.layers.Conv2D(channels, 1, use_bias=False)(x)
        x = keras.layers.MaxPooling2D(2)(keras.layers.ReLU()(keras.layers.Add()([x, y])))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="small_resnet")


if __name__ == "__main__":
    import tfdp

    result = tfdp.run(model=small_resnet, num_gpus=2, epochs=2, batch_size=128, lr=0.1,
                      momentum=0.9, steps_per_epoch=80, eval_steps=10)
    print(f"test accuracy: {result.test_accuracy:.3f}; exported to {result.export_path}")
