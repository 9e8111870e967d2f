"""The Keras scripts ``tfdp.bench --time_to_accuracy`` holds tfdp against, each as a user would
write it, ``fit`` on numpy arrays, timed by tfdp's clock (``tfdp.training.clock``: from before
the data is read to the end of the evaluation, on the whole test set, that first reaches the
target):

* ``beginner``: the beginner's CNN, the shape of Keras' and TensorFlow's tutorials: two conv
  blocks, Adam, batch 128;
* ``tuned``: the tuned reference, the fast recipe's choices written with Keras' own parts:
  LeNet with batch normalization, Nesterov SGD (momentum 0.9, weight decay 5e-4) on a one-cycle
  rate (Keras' ``CosineDecay`` with its linear warm-up, 0.04 up to 0.4 over the first quarter
  of the run, then down), label smoothing 0.1, batch 512; the schedule spans ``--epochs``.

  python -m tfdp.bench.references --reference=tuned --workdir=DIR --target_accuracy=0.9 --seed=1

Writes ``<workdir>/metrics.json`` with the fields the bench reads from ``tfdp.train`` runs
(every epoch's ``test_acc``, ``clock_s``, ``examples`` and ``examples_per_sec``,
``reached_at_epoch``, ``startup_s``).
"""

import json
import os
import time

from absl import app, flags

from tfdp.training.clock import Clock

EPOCHS = {"beginner": 12, "tuned": 4}  # At most: the runs stop at the target.
BATCH = {"beginner": 128, "tuned": 512}


def define_flags() -> None:
    """The command line's flags, defined when run as a program only: the models below are
    imported by the bench too (its FLOPs per example), whose own flags share these names."""
    flags.DEFINE_enum("reference", "beginner", ["beginner", "tuned"], "Which script.")
    flags.DEFINE_string("workdir", None, "Where metrics.json goes.", required=True)
    flags.DEFINE_float("target_accuracy", 0.9, "Stop at the first evaluation at or above this.")
    flags.DEFINE_integer("epochs", None, "Epochs at most (default: the reference's own; the "
                         "tuned one's schedule spans them).")
    flags.DEFINE_integer("seed", 1, "Keras' seed (weights, shuffling).")
    flags.DEFINE_integer("steps_per_epoch", None, "Cap on steps per epoch (tests).")
    flags.DEFINE_integer("eval_examples", None, "Cap on test examples (tests; default all).")
    flags.DEFINE_string("data_dir", None, "TFDS data dir (as for tfdp.train).")
    flags.DEFINE_string("manual_dir", None, "Fashion-MNIST .gz folder (as for tfdp.train).")


def beginner_model():
    import keras

    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10)], name="beginner_cnn")


def tuned_model():
    import keras

    def normalized(layer):
        return [layer, keras.layers.BatchNormalization(), keras.layers.ReLU()]

    return keras.Sequential([
        keras.Input((28, 28, 1)),
        *normalized(keras.layers.Conv2D(20, 3, use_bias=False)), keras.layers.AveragePooling2D(2),
        *normalized(keras.layers.Conv2D(50, 5, use_bias=False)), keras.layers.AveragePooling2D(2),
        keras.layers.Flatten(), *normalized(keras.layers.Dense(128, use_bias=False)),
        keras.layers.Dense(10)], name="lenet_bn")


def compiled(reference: str, steps: int):
    """The reference's model, compiled for a run of ``steps`` steps; and whether its labels
    are one-hot (Keras' label smoothing takes one-hot labels only)."""
    import keras

    if reference == "beginner":
        net = beginner_model()
        net.compile(optimizer="adam", metrics=["accuracy"],
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return net, False
    net = tuned_model()
    net.compile(optimizer=keras.optimizers.SGD(one_cycle(steps), momentum=0.9, nesterov=True,
                                               weight_decay=5e-4),
                loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1),
                metrics=["categorical_accuracy"])
    return net, True


def one_cycle(steps: int):
    """The tuned reference's rate over a run of ``steps``: Keras' cosine decay after its linear
    warm-up, 0.04 up to 0.4 over the first quarter, then down to 0."""
    import keras

    warmup = steps // 4
    return keras.optimizers.schedules.CosineDecay(0.04, steps - warmup, warmup_target=0.4,
                                                  warmup_steps=warmup)


def main(argv):
    del argv
    FLAGS = flags.FLAGS
    import keras  # Imports are start-up, outside the clock, as in tfdp.train.

    from tfdp.data import pipeline, sources

    clock = Clock()
    clock.start()  # Before the data is read, as tfdp.train's.
    keras.utils.set_random_seed(FLAGS.seed)
    reference, batch = FLAGS.reference, BATCH[FLAGS.reference]
    epochs = FLAGS.epochs or EPOCHS[reference]
    train, test = pipeline.load_splits(sources.prepare(data_dir=FLAGS.data_dir,
                                                    manual_dir=FLAGS.manual_dir))
    x, y = train.images.astype("float32") / 255.0, train.labels
    if FLAGS.steps_per_epoch:
        x, y = x[:FLAGS.steps_per_epoch * batch], y[:FLAGS.steps_per_epoch * batch]
    n = FLAGS.eval_examples or len(test.labels)
    tx, ty = test.images[:n].astype("float32") / 255.0, test.labels[:n]
    net, one_hot = compiled(reference, epochs * -(-len(y) // batch))
    if one_hot:
        y, ty = keras.utils.to_categorical(y, 10), keras.utils.to_categorical(ty, 10)
    records, reached = [], None
    for epoch in range(epochs):
        started = time.perf_counter()
        net.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        seconds = time.perf_counter() - started
        test_acc = float(net.evaluate(tx, ty, batch_size=1000, verbose=0)[1])
        records.append({"epoch": epoch + 1, "test_acc": test_acc, "clock_s": clock.reading(),
                        "examples": len(y), "examples_per_sec": len(y) / seconds})
        print(f"epoch {epoch + 1}: test_acc {test_acc:.4f}, {records[-1]['clock_s']:.1f} s on "
              "the clock", flush=True)
        if test_acc >= FLAGS.target_accuracy:
            reached = epoch + 1
            break
    os.makedirs(FLAGS.workdir, exist_ok=True)
    with open(os.path.join(FLAGS.workdir, "metrics.json"), "w") as f:
        json.dump({"epochs": records, "reached_at_epoch": reached, "startup_s": clock.startup,
                   "target_accuracy": FLAGS.target_accuracy, "precision": "float32"}, f)


if __name__ == "__main__":
    define_flags()
    app.run(main)
