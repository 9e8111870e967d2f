"""Comparing runs: small real slices, starting weights that make float32 runs comparable, how
far two runs' updates disagree, the manual loop on given splits, and an export's logits
against trained parameters."""

import numpy as np

from tfdp.data import pipeline
from tfdp.models import lenet


def head(split, n):
    """The first ``n`` examples of a split: a small real slice."""
    return pipeline.Split(split.images[:n], split.labels[:n])


def comparable_start(seed=3, dtype=np.float32):
    """Glorot weights with the first conv bias at 0.05, for comparing runs in float32.

    Fashion-MNIST is mostly exact-zero background, where the first conv's input to ReLU is
    exactly b1. The textbook starts b1 at zero; float32 rounding then leaves b1 entries of either
    sign, flipping ReLU's derivative at ~10^5 positions per batch, so two correct runs that
    differ only in summation order drift apart by percents within a few dozen steps (float64,
    too fine to flip, does not). Away from zero the runs agree to ~1e-6 per update, until the
    same happens one layer up: all background positions share one conv-2 input per channel,
    and when a channel's crosses zero the float32 runs may cross it a step apart (seen after 2
    steps on one CPU, 10-15 on another). Whole runs are therefore compared in float64, and
    float32 one step at a time from equal weights (tests/test_manual_trainer.py).
    """
    params = lenet.init_params(seed, dtype, "glorot")
    params["b1"] = np.full_like(params["b1"], 0.05)
    return params


def update_difference(a, b, start):
    """max over parameters of |a - b| / |b - start|: how far two runs' updates disagree."""
    return max(np.linalg.norm(a[n] - b[n]) / np.linalg.norm(b[n] - start[n]) for n in a)


def train_manual(config, train_split, test_split, params=None):
    """The manual path on given splits, from LeNet ``params`` (else ``--init``), through the
    one entry that trains, without an export: (the trained parameters, the ``Result``)."""
    from tfdp.training import entry

    weights = lenet.to_keras_weights(params) if params is not None else None
    result = entry.train(config, weights, (train_split, test_split), export=False)
    return lenet.from_keras_weights(result.weights), result


def served_disagreement(version, trained, start, images) -> float:
    """|served logits - ``trained``'s logits| / |how far training moved them|, on ``images``
    (uint8), for an export ``version`` folder against float64 LeNet parameters: the export
    computes in float64 and serves float32 logits, so that rounding only (~1e-7)."""
    import tensorflow as tf

    images = tf.constant(images)
    served = tf.saved_model.load(str(version)).signatures["serving_default"](
        images=images)["logits"].numpy()

    def logits(params):
        return lenet.apply(params, pipeline.to_float(images, tf.float64)).numpy()

    moved = np.linalg.norm(logits(trained) - logits(start))
    return np.linalg.norm(served - logits(trained)) / moved


def served_logits(version, images):
    """The logits the export in folder ``version`` serves for the uint8 ``images``."""
    import tensorflow as tf

    return tf.saved_model.load(str(version)).signatures["serving_default"](
        images=tf.constant(images))["logits"].numpy()


def serve_alike(version, other, images, tolerance: float = 1e-5) -> float:
    """How far apart two exports' served logits are on ``images``, relative to the logits'
    size; fails above ``tolerance``."""
    ours, theirs = served_logits(version, images), served_logits(other, images)
    apart = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    assert apart < tolerance, apart
    return apart


def serves_like_two_devices_never_interrupted(version, folder, data_dir, images, strategy: str,
                                              settings: dict, what: str) -> None:
    """The export in ``version`` serves, within 1e-9 in float64, the logits on ``images`` of
    ``strategy`` trained with ``settings`` on two local devices never interrupted (here, in the
    test process, in ``folder``): an elastic group's model is the one an uninterrupted run
    trains."""
    from tfdp.config.settings import Config
    from tfdp.training import entry

    reference = entry.train(Config(strategy=strategy, num_gpus=2, data_dir=data_dir,
                                   workdir=str(folder / "whole"),
                                   export_dir=str(folder / "whole-export"), **settings))
    away = np.abs(served_logits(version, images) - served_logits(reference.export_path,
                                                                 images)).max()
    assert away <= 1e-9, (f"{what}: {away:.3g} away in the logits from two devices never "
                          "interrupted")
