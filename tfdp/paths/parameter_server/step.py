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
    """``step(arrays, indices, lr, number) -> (loss, correct, staleness, worker, times)`` on one
    worker: pull, compute the batch's gradient, push the update of global step ``number`` (an
    int64) to each variable that it has not reached yet, so a step run again after its worker
    was lost applies each update once. ``worker`` is the index of the worker that ran it,
    ``times`` the Unix times at which it started and its push had landed
    (``tfdp.paths.parameter_server.pace``)."""
    variables = store.trainable
    flip, sgd = config.augment == "flip", Optimizer.of(config)  # SGD, no momentum: its checks.

    def step(arrays, indices, lr, number):
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
        for v, g, marks in zip(variables, grads, store.marks):
            with tf.name_scope(f"update/{v.name.split(':')[0].split('/')[0]}"):
                pushed.append(once(marks, number, lambda fresh, v=v, g=g: sgd.update(
                    v, tf.where(fresh, g, tf.zeros_like(g)), tf.where(fresh, lr, 0.0))))
        with tf.control_dependencies(pushed):
            counted = once(store.marks[-1], number,
                           lambda fresh: store.updates.assign_add(tf.cast(fresh, tf.int64)))
        with tf.control_dependencies([counted]):
            applied = store.updates.read_value()
        with tf.control_dependencies([applied]):
            landed = tf.timestamp()
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        # Staleness: the updates that landed between this step's pull and its push.
        stale = applied - seen - tf.cast(counted, tf.int64)
        return (loss, count_correct(logits, y), stale, worker,
                tf.stack([started, landed]))

    return tf.function(step, autograph=False)  # As the from-scratch steps (nothing to convert).


def once(marks: tf.Variable, number, push):
    """``push(fresh)``, where ``fresh`` says whether step ``number`` has not marked ``marks``
    (``Store.marks``) yet and ``push`` applies nothing when it has, then the mark: both on the
    server holding ``marks``, where the mark needs nothing from the worker that the test did
    not, so a worker lost in between cannot leave a push without its mark. (A push of zeros,
    not a ``tf.cond``: the branch cost the step more.) Returns ``fresh``."""
    with tf.device(marks.device):
        slot = number % marks.shape[0]
        fresh = tf.not_equal(tf.gather(marks, slot), number)
        with tf.control_dependencies([push(fresh)]):
            mark = tf.raw_ops.ResourceScatterUpdate(resource=marks.handle, indices=slot,
                                                    updates=number)
        with tf.control_dependencies([mark]):
            return tf.identity(fresh)


def make_eval_step(store: Store, eval_flip: bool = False):
    """``step(arrays, indices) -> (summed loss, confusion matrix)`` on one worker."""

    def step(arrays, indices):
        images, labels = next(arrays)
        x, y = tf.gather(images, indices), tf.gather(labels, indices)
        logits = test_logits(lambda x: store.logits(x, training=False), x, eval_flip)
        return summed_cross_entropy(logits, y), confusion(logits, y)

    return tf.function(step, autograph=False)  # As the from-scratch steps (nothing to convert).
