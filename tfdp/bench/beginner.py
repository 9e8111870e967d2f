"""The beginner's Keras CNN, the reference ``tfdp.bench --time_to_accuracy`` holds tfdp
against: two conv blocks, Adam, batch 128, ``fit`` on numpy arrays, the shape of Keras' and
TensorFlow's tutorials, timed by tfdp's clock (``tfdp.training.clock``: from before the data is
read to the end of the evaluation, on the whole test set, that first reaches the target).

  python -m tfdp.bench.beginner --workdir=DIR --target_accuracy=0.9 --epochs=10 --seed=1

Writes ``<workdir>/metrics.json`` with the fields the bench reads from ``tfdp.train`` runs
(every epoch's ``test_acc`` and ``clock_s``, ``reached_at_epoch``, ``startup_s``).
"""

import json
import os

from absl import app, flags

from tfdp.training.clock import Clock

flags.DEFINE_string("workdir", None, "Where metrics.json goes.", required=True)
flags.DEFINE_float("target_accuracy", 0.9, "Stop at the first evaluation at or above this.")
flags.DEFINE_integer("epochs", 10, "Epochs at most.")
flags.DEFINE_integer("seed", 1, "Keras' seed (weights, shuffling).")
flags.DEFINE_integer("steps_per_epoch", None, "Cap on steps per epoch (tests).")
flags.DEFINE_integer("eval_examples", None, "Cap on test examples (tests; default all).")
flags.DEFINE_string("data_dir", None, "TFDS data dir (as for tfdp.train).")
flags.DEFINE_string("manual_dir", None, "Fashion-MNIST .gz folder (as for tfdp.train).")
FLAGS = flags.FLAGS
BATCH = 128


def model():
    import keras

    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10)], name="beginner_cnn")


def main(argv):
    del argv
    import keras  # Imports are start-up, outside the clock, as in tfdp.train.

    from tfdp import data, datasets

    clock = Clock()
    clock.start()  # Before the data is read, as tfdp.train's.
    keras.utils.set_random_seed(FLAGS.seed)
    train, test = data.load_splits(datasets.prepare(data_dir=FLAGS.data_dir,
                                                    manual_dir=FLAGS.manual_dir))
    x, y = train.images.astype("float32") / 255.0, train.labels
    if FLAGS.steps_per_epoch:
        x, y = x[:FLAGS.steps_per_epoch * BATCH], y[:FLAGS.steps_per_epoch * BATCH]
    n = FLAGS.eval_examples or len(test.labels)
    tx, ty = test.images[:n].astype("float32") / 255.0, test.labels[:n]
    net = model()
    net.compile(optimizer="adam", metrics=["accuracy"],
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    records, reached = [], None
    for epoch in range(FLAGS.epochs):
        net.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        test_acc = float(net.evaluate(tx, ty, batch_size=1000, verbose=0)[1])
        records.append({"epoch": epoch + 1, "test_acc": test_acc, "clock_s": clock.reading()})
        print(f"epoch {epoch + 1}: test_acc {test_acc:.4f}, {records[-1]['clock_s']:.1f} s on "
              "the clock", flush=True)
        if test_acc >= FLAGS.target_accuracy:
            reached = epoch + 1
            break
    os.makedirs(FLAGS.workdir, exist_ok=True)
    with open(os.path.join(FLAGS.workdir, "metrics.json"), "w") as f:
        json.dump({"epochs": records, "reached_at_epoch": reached, "startup_s": clock.startup,
                   "target_accuracy": FLAGS.target_accuracy}, f)


if __name__ == "__main__":
    app.run(main)
