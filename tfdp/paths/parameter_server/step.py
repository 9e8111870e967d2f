"""The parameter-server path's steps, each run on one worker by the coordinator: a training step
(pull, gradient, push) and an evaluation step. Their ops are named by phase (``input``,
``forward``, ``backward``, ``update/<parameter>``) for ``--trace_steps``
(``tfdp.trace.timeline.classify``)."""

import tensorflow as tf

from tfdp.data import pipeline
from tfdp.models.loss import confusion, count_correct, summed_cross_entropy, test_logits
from tfdp.models.optimizers import Optimizer
from tfdp.paths.parameter_server.store import Store


def make_train_step(store: Store, config):
    """``step(arrays, indices, lr) -> (loss, correct, staleness, worker, times)`` on one worker:
    pull, compute the batch's gradient, push the update. ``worker`` is the index of the worker
    that ran it, ``times`` the Unix times at which it started and its push had landed
    (``tfdp.paths.parameter_server.pace``)."""
    variables = store.trainable
    flip, sgd = config.augment == "flip", Optimizer.of(config)  # SGD, no momentum: its checks.

    def step(arrays, indices, lr):
        started = tf.timestamp()
        with tf.name_scope("input"):
            images, labels = next(arrays)
            x, y = pipeline.gather(images, labels, indices, flip)
        seen = store.updates.read_value()
        with tf.control_dependencies([seen]), tf.name_scope("forward"):  # Pull after reading.
            with tf.GradientTape() as tape:
                logits = store.logits(x, training=True)
                loss = (summed_cross_entropy(logits, y, config.label_smoothing)
                        / tf.cast(tf.shape(y)[0], logits.dtype)) + store.own_loss(logits.dtype)
        with tf.name_scope("backward"):
            grads = tape.gradient(loss, variables)
        pushed = []
        for v, g in zip(variables, grads):
            with tf.name_scope(f"update/{v.name.split(':')[0].split('/')[0]}"):
                pushed.append(sgd.update(v, g, lr))
        with tf.control_dependencies(pushed):
            applied = store.updates.assign_add(1)
        with tf.control_dependencies([applied]):
            landed = tf.timestamp()
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return (loss, count_correct(logits, y), applied - 1 - seen, worker,
                tf.stack([started, landed]))

    return tf.function(step, autograph=False)  # As the from-scratch steps (nothing to convert).


def make_eval_step(store: Store, eval_flip: bool = False):
    """``step(arrays, indices) -> (summed loss, confusion matrix)`` on one worker."""

    def step(arrays, indices):
        images, labels = next(arrays)
        x, y = tf.gather(images, indices), tf.gather(labels, indices)
        logits = test_logits(lambda x: store.logits(x, training=False), x, eval_flip)
        return summed_cross_entropy(logits, y), confusion(logits, y)

    return tf.function(step, autograph=False)  # As the from-scratch steps (nothing to convert).
