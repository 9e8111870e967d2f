"""The stock baseline for ``tfdp.bench``: Keras ``fit(x, y, batch_size=...)`` on numpy arrays,
one device, no strategy, default thread pools: how Keras' guides train a model.

  python -m tfdp.bench_stock <workdir> <batch_size> <epochs> <steps> <synthetic 0|1> [data_dir]

Writes ``<workdir>/metrics.json`` with the same per-epoch fields the bench reads from
``tfdp.train`` runs.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

from tfdp import data  # noqa: E402
from tfdp.models import lenet  # noqa: E402


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


def main(workdir, batch_size, epochs, steps, synthetic, data_dir=None):
    train, _ = data.load_splits(data_dir, None, synthetic)
    n = min(len(train.labels), steps * batch_size)
    x, y = train.images[:n].astype("float32") / 255.0, train.labels[:n]
    model = lenet.keras_model()
    model.compile(optimizer=keras.optimizers.SGD(0.2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    timer = EpochTimer(n)
    model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=[timer])
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.json"), "w") as f:
        json.dump({"epochs": timer.records}, f)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]), int(a[2]), int(a[3]), a[4] == "1", a[5] if len(a) > 5 else None)
