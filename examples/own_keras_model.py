"""Your own Keras model with tfdp's pieces: the strategy (logical devices, thread pools), the
Fashion-MNIST batches cut per replica like the from-scratch path's, and the training step that
weights every example by 1 / global batch.

    python examples/own_keras_model.py

Trains a small dense model for two epochs under MirroredStrategy on two devices (two logical
CPUs where there are no GPUs). The data is prepared as for ``python -m tfdp.train`` (TFDS'
data dir: $TFDS_DATA_DIR or ~/tensorflow_datasets).
"""

from tfdp import logs

logs.configure(verbose=False)
logs.import_tensorflow()  # First: TensorFlow's C++ start-up banners hidden, as tfdp.train's.

import keras  # noqa: E402 (after TensorFlow's quiet start)

from tfdp import data, plan  # noqa: E402
from tfdp.keras_path import distributed_input, strategy, train_step  # noqa: E402

dist = strategy.make_distribution("mirrored", num_gpus=2)  # logical devices, thread pools
train, test = data.load_splits()                             # Fashion-MNIST, uint8 arrays
batches = data.train_batches(train, 256, seed=0, first_epoch=0, epochs=2)
with dist.strategy.scope():
    inputs = keras.Input((28, 28, 1))
    hidden = keras.layers.Dense(256, activation="relu")(keras.layers.Flatten()(inputs))
    model = train_step.global_batch_model(keras.Model(inputs, keras.layers.Dense(10)(hidden)))
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(distributed_input.distribute(dist.strategy, batches, dist.replicas), epochs=2,
          steps_per_epoch=plan.steps_per_epoch(len(train.labels), 256), shuffle=False)
