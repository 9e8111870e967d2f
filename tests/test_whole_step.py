"""Which step a ``multi_worker`` survivor holds whole (``tfdp.paths.keras.whole_step``), in the
test process under MirroredStrategy on 2 logical devices: the same per-replica marks and copy
a worker of a group that goes on keeps. A real loss, and the same model after it, is
tests/test_elastic.py's."""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

from conftest import DEVICES, REPO
from tfdp.paths.keras.callback import training_state
from tfdp.paths.keras.train_step import global_batch_model
from tfdp.paths.keras.whole_step import WholeStep

sys.path.insert(0, os.path.join(REPO, "tests", "own_models"))
import zoo  # noqa: E402


def test_a_survivor_holds_the_step_it_finished_or_the_one_before_the_step_in_flight():
    """After each step the two marks agree and the live state is the step's. A step in flight
    (begun, not finished: its all-reduce failed) leaves the weights and the optimizer's slots
    as they were, and the worker holds the step before it: what that step's forward pass
    moved (batch normalization's statistics, Dropout's seed state) comes from the copy taken
    before it, the rest from the live variables."""
    strategy = tf.distribute.MirroredStrategy(DEVICES[:2])
    with strategy.scope():
        model = global_batch_model(zoo.regularized_cnn((12, 12, 1), 3, strength=0.0,
                                                       dropout=0.5, normalized=True))
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        model.optimizer.build(model.trainable_variables)
        marks = model.whole_step = WholeStep(model, strategy)
        marks.start_at(0)
    rng = np.random.default_rng(0)
    batches = tf.data.Dataset.from_tensor_slices((
        rng.normal(size=[64, 12, 12, 1]).astype(np.float32), rng.integers(0, 3, 64),
        np.full([64], 1 / 16, np.float32))).batch(16)
    assert marks.held()[0] == 0

    model.fit(batches.take(1), epochs=1, verbose=0, shuffle=False)
    step, read = marks.held()
    assert step == 1 and _same(read(), training_state(model))
    before = training_state(model)

    model.fit(batches.skip(1).take(1), epochs=1, verbose=0, shuffle=False)
    after = training_state(model)
    step, read = marks.held()
    assert step == 2 and _same(read(), after)
    moved = [not v.trainable for v in model.weights]
    assert any(moved) and after.states  # The statistics, and Dropout's seed state.
    assert not any(np.array_equal(b, a) for b, a, m in zip(before.weights, after.weights, moved)
                   if m), "the step moved no statistic: nothing to tell the copy from"
    assert not _equal(before.states, after.states)

    marks._began.assign(2)  # Step 2 begun, not finished: as its all-reduce had failed.
    marks._finished.assign(1)
    step, read = marks.held()
    held = read()
    assert step == 1
    for kept, b, a, m in zip(held.weights, before.weights, after.weights, moved):
        np.testing.assert_array_equal(kept, b if m else a)  # The copy, else the live weights.
    for kept, b in zip(held.states, before.states):
        np.testing.assert_array_equal(kept, b)
    assert held.slots and _equal(held.slots, after.slots)  # The momentum: live.


def _same(a, b) -> bool:
    return all(_equal(getattr(a, group), getattr(b, group))
               for group in ("weights", "slots", "averages", "states"))


def _equal(xs, ys) -> bool:
    return len(xs) == len(ys) and all(np.array_equal(x, y) for x, y in zip(xs, ys))
