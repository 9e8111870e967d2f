"""The stock baseline for ``tfdp.bench``: Keras ``fit(x, y, batch_size=...)`` on numpy arrays,
one device, no strategy, default thread pools: how Keras' guides train a model (the bench's
``--model``: a built-in, or yours).

  python -m tfdp.bench.stock --workdir=DIR --batch_size=256 --epochs=3 --steps=60 [--synthetic]

Writes ``<workdir>/metrics.json`` with the same per-epoch fields the bench reads from
``tfdp.train`` runs.
"""

import json
import os
import time

import keras
from absl import app, flags

from tfdp.data import pipeline, sources
from tfdp.models import catalog

flags.DEFINE_string("workdir", None, "Where metrics.json goes.", required=True)
flags.DEFINE_string("model", "lenet", "The model, as tfdp.train's --model.")
flags.DEFINE_integer("batch_size", 256, "Minibatch.")
flags.DEFINE_integer("epochs", 3, "Epochs (the bench drops the first).")
flags.DEFINE_integer("steps", 60, "Steps per epoch.")
flags.DEFINE_boolean("synthetic", False, "Random images of the real shapes instead of the pipeline.")
flags.DEFINE_string("data_dir", None, "TFDS data dir (as for tfdp.train).")
FLAGS = flags.FLAGS


class EpochTimer(keras.callbacks.Callback):
    def __init__(self, examples):
        super().__init__()
        self.examples, self.records = examples, []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self.start
        self.records.append({"epoch": epoch + 1, "seconds": seconds,
                             "examples_per_sec": self.examples / seconds})


def main(argv):
    del argv
    workdir, batch_size, epochs, steps = FLAGS.workdir, FLAGS.batch_size, FLAGS.epochs, FLAGS.steps
    train, _ = pipeline.load_splits(sources.prepare(data_dir=FLAGS.data_dir), FLAGS.synthetic)
    n = min(len(train.labels), steps * batch_size)
    x, y = train.images[:n].astype("float32") / 255.0, train.labels[:n]
    model = catalog.build(FLAGS.model, train.images.shape[1:], 10)
    model.compile(optimizer=keras.optimizers.SGD(0.2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    timer = EpochTimer(n)
    model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=[timer])
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.json"), "w") as f:
        json.dump({"epochs": timer.records}, f)


if __name__ == "__main__":
    app.run(main)
