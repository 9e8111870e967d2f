"""The from-scratch training loop: the textbook's algorithm, one visible step at a time.

Every step: split the global batch across the devices; on each device, a forward and backward
pass of its own replica under its own ``GradientTape``, with the loss summed over its shard and
divided by the *global* batch size (so the per-device gradients add up to the gradient of the
mean loss); an allreduce sums the gradients; every replica applies the same SGD update and so
stays identical to the others. The step is compiled with ``tf.function`` unless ``eager``.
"""

import contextlib
import time
from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf

from tfdp import data, schedule
from tfdp.errors import Diverged, Preempted, UserError
from tfdp.manual.allreduce import ALLREDUCE
from tfdp.manual.replicate import replicate, split_batch
from tfdp.models import lenet

_IMAGES = tf.TensorSpec([None, *data.IMAGE_SHAPE], tf.uint8)
_LABELS = tf.TensorSpec([None], tf.int64)


class Feed(NamedTuple):
    """Where the steps' examples come from. A batch is a tuple of tensors of the ``signature``;
    ``shards(split, *batch)`` cuts it into one ``(images, labels)`` pair per device, placed
    there. Here, the batches are the images themselves; across machines
    (``tfdp.manual.remote``), example indices into arrays each worker holds."""
    signature: list
    train_batches: Callable   # (first_epoch, offset) -> iterator over the remaining batches
    eval_batches: Callable    # () -> the evaluation's batches
    shards: Callable


def local_feed(config, plan, devices: list, train_split: data.Split,
               test_split: data.Split) -> Feed:
    """Global batches of images from arrays in this process, split with ``split_batch``."""
    def train_batches(first_epoch, offset):
        return iter(data.train_batches(train_split, plan.global_batch, config.seed, first_epoch,
                                       config.epochs, config.steps_per_epoch).skip(offset))

    return Feed([_IMAGES, _LABELS], train_batches,
                lambda: data.eval_batches(test_split, plan.global_batch, plan.eval_steps),
                lambda split, images, labels: split_batch(images, labels, devices))


def make_train_step(replicas: list, devices: list, allreduce: str, eager: bool = False,
                    feed: Feed = None, compute_dtype=None, allreduce_dtype=None):
    """``step(*batch, lr) -> (loss, correct)`` over the global batch, updating replicas. The
    batch is ``(images, labels)`` unless a ``feed`` says otherwise. ``compute_dtype``
    (default: the parameters') is what the forward and backward passes compute in;
    ``allreduce_dtype`` (default: the gradients') is what the gradients travel and are summed
    in, cast back before the update."""
    reduce = ALLREDUCE[allreduce]
    dtype = replicas[0]["W1"].dtype
    compute = tf.as_dtype(compute_dtype or dtype)
    travel = tf.as_dtype(allreduce_dtype or dtype)
    signature, shards = _batch_of(feed, devices)

    def step(*batch_and_lr):
        *batch, lr = batch_and_lr
        placed = shards("train", *batch)
        n = tf.cast(tf.shape(batch[-1])[0], dtype)  # Labels, or indices: both one per example.
        grads, losses, correct = [], [], []
        for device, params, (x, y) in zip(devices, replicas, placed):
            with tf.device(device):
                loss, right, *g = _unless_empty(
                    y, lambda: _shard_gradients(params, x, y, n, compute),
                    lambda: [tf.zeros([], dtype), tf.zeros([], tf.int64),
                             *[tf.zeros_like(v) for v in params.values()]])
                grads.append(g)
                losses.append(loss)
                correct.append(right)
        if travel != dtype:
            grads = [_cast_on(device, g, travel) for device, g in zip(devices, grads)]
        summed = reduce(grads, devices)
        for device, params, g in zip(devices, replicas, summed):
            with tf.device(device):
                for var, grad in zip(params.values(), g):
                    var.assign_sub(tf.cast(lr, dtype) * tf.cast(grad, dtype))
        return tf.add_n(losses), tf.add_n(correct)

    if eager:
        return step
    return tf.function(step, input_signature=[*signature, tf.TensorSpec([], tf.float32)])


def _batch_of(feed, devices):
    """(the step's batch signature, the function cutting a batch into placed shards)."""
    if feed is not None:
        return feed.signature, feed.shards
    return [_IMAGES, _LABELS], lambda split, images, labels: split_batch(images, labels, devices)


def _cast_on(device, tensors, dtype) -> list:
    with tf.device(device):
        return [tf.cast(t, dtype) for t in tensors]


def _shard_gradients(params: dict, x, y, global_batch, compute):
    """One device's forward and backward pass: (loss share, correct, gradients)."""
    with tf.GradientTape() as tape:
        logits = lenet_logits(params, x, compute)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        loss = tf.reduce_sum(per_example) / global_batch  # / global batch: grads then add up
    return [loss, count_correct(logits, y), *tape.gradient(loss, list(params.values()))]


def make_eval_step(replicas: list, devices: list, eager: bool = False, feed: Feed = None,
                   compute_dtype=None):
    """``step(*batch) -> (summed loss, correct)``, the batch split like in training."""
    dtype = replicas[0]["W1"].dtype
    compute = tf.as_dtype(compute_dtype or dtype)
    signature, shards = _batch_of(feed, devices)

    def shard_sums(params, x, y):
        logits = lenet_logits(params, x, compute)
        return [tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)),
                count_correct(logits, y)]

    def step(*batch):
        losses, correct = [], []
        for device, params, (x, y) in zip(devices, replicas, shards("test", *batch)):
            with tf.device(device):
                loss, right = _unless_empty(y, lambda: shard_sums(params, x, y),
                                            lambda: [tf.zeros([], dtype), tf.zeros([], tf.int64)])
                losses.append(loss)
                correct.append(right)
        return tf.add_n(losses), tf.add_n(correct)

    return step if eager else tf.function(step, input_signature=signature)


def lenet_logits(params: dict, images, compute):
    """LeNet's logits, in the parameters' dtype, computed in ``compute``. Under mixed
    precision (bfloat16) the parameters are cast on the way in and the logits back, so the
    softmax and the loss are float32 and the gradients reach the float32 parameters through
    the casts."""
    dtype = params["W1"].dtype
    if compute == dtype:
        return lenet.apply(params, data.to_float(images, dtype))
    low = {name: tf.cast(value, compute) for name, value in params.items()}
    return tf.cast(lenet.apply(low, data.to_float(images, compute)), dtype)


def _unless_empty(labels, compute, zeros) -> list:
    """``compute()``, or ``zeros()`` when this device's shard is empty (a global batch smaller
    than the device count): an empty shard contributes nothing, and never reaches a kernel
    (oneDNN's convolution refuses an empty batch)."""
    return tf.cond(tf.size(labels) > 0, compute, zeros)


def evaluate(eval_step, batches, plan) -> tuple:
    """(mean loss, accuracy) over the test set's ``batches`` (``plan.eval_steps`` or all)."""
    loss = correct = 0
    for batch in batches:
        batch_loss, batch_correct = eval_step(*batch)
        loss += float(batch_loss)
        correct += int(batch_correct)
    return loss / plan.eval_examples, correct / plan.eval_examples


def run(config, start_weights=None):
    """The from-scratch path: devices (here, or a cluster's workers: ``tfdp.manual.remote``),
    data and plan, train, report, export (``tfdp.paths``). A run given the folder of an
    interrupted one resumes from its newest backup."""
    from tfdp import checkpoints, cluster, export, paths, preemption
    from tfdp import devices as device_setup
    from tfdp.manual import remote

    with preemption.Watch() as watch:
        backups = checkpoints.Backups(config.run_dir, 0, config.identity)
        task = remote.task_of(config)
        if task:
            spread = remote.connect(task, config.num_gpus, config.data_dir,
                                    config.collective_timeout, backups.steps)
            names, where, stall = spread.devices, spread.describe(), spread.stall
        else:
            names = device_setup.configure_devices(config.num_gpus)
            where, stall = f"{len(names)} device(s) {names}", None
        first_step = checkpoints.resume_step(backups)
        started = paths.start(config, names, len(names), engine=(
            f"{where}, allreduce {config.allreduce}, "
            f"{'eager' if config.eager else 'compiled'} step"), first_step=first_step,
            examples=(spread.examples["train"], spread.examples["test"]) if task else None)
        feed = (spread.feed(config, started.plan) if task else
                local_feed(config, started.plan, names, started.train_split, started.test_split))
        if first_step:
            params = lenet.from_keras_weights(backups.load(first_step))
        else:
            params = None if start_weights is None else lenet.from_keras_weights(start_weights)
        try:
            params = train(config, started.plan, names, None, None, started.reporter, params,
                           first_step=first_step, backups=backups, watch=watch, feed=feed,
                           stall=stall)
        except remote.PEER_LOST as e:
            if not task:
                raise
            raise UserError(cluster.lost_contact(type(e).__name__, spread.stall.peers,
                                                 str(e.message), backups.steps())) from None
        result = paths.finish(started, lenet.to_keras_weights(params), export=lambda: export.export(
            serving_model(params, config.precision), config.export_root), backups=backups)
    backups.clear()
    return result


def train(config, plan, devices: list, train_split: data.Split, test_split: data.Split,
          reporter, params: dict = None, first_step: int = 0, backups=None, watch=None,
          feed: Feed = None, stall=None) -> dict:
    """Train LeNet data-parallel on ``devices`` by ``plan`` from global step ``first_step``;
    return the trained parameters (numpy). ``params`` overrides ``config.initializer``. The
    examples come from the splits, or from a ``feed`` instead.

    With ``backups``, the state is saved after every epoch; with ``watch``, a SIGTERM stops the
    loop after the current step, which is saved, and raises ``Preempted``. A non-finite loss
    raises ``Diverged`` at once. Across machines, ``stall`` (``tfdp.manual.remote.Stall``) ends
    the process when the cluster stops answering."""
    if params is None:
        params = lenet.start_params(config.initializer, config.seed,
                                    np.dtype(config.variable_dtype))
    feed = feed or local_feed(config, plan, devices, train_split, test_split)
    busy = stall.watching if stall else lambda doing: contextlib.nullcontext()
    with busy("placing the replicas"):
        replicas = replicate(params, devices)
    # --allreduce_dtype=float32 is the gradients' own dtype (float64 under --precision=float64).
    travel = config.allreduce_dtype if config.allreduce_dtype == "bfloat16" else None
    train_step = make_train_step(replicas, devices, config.allreduce, config.eager, feed,
                                 config.precision, travel)
    eval_step = make_eval_step(replicas, devices, config.eager, feed, config.precision)
    steps = plan.steps_per_epoch
    first_epoch, offset = divmod(first_step, steps)

    def trained():
        with busy("reading the trained parameters"):
            return {name: var.numpy() for name, var in replicas[0].items()}

    if first_epoch >= config.epochs:  # Resumed after the last step: nothing left to train.
        return trained()
    batches = feed.train_batches(first_epoch, offset)

    def weights():
        return lenet.to_keras_weights(trained())

    global_step = first_step
    if watch:
        watch.step, watch.training = first_step, True  # SIGTERM now waits for the end of a step.
    for epoch in range(first_epoch, config.epochs):
        first = offset if epoch == first_epoch else 0
        progress = reporter.progress(epoch, steps)
        loss_sum = correct = seen = 0
        start = time.perf_counter()
        for i in range(first, steps):
            if watch and watch.requested:
                saved = backups.save(global_step, weights()) if backups else None
                raise Preempted(global_step, saved)
            batch = next(batches)
            lr = schedule.learning_rate(global_step, plan.base_lr, plan.peak_lr,
                                        plan.warmup_steps)
            with busy(f"training step {global_step + 1}"):
                loss, right = train_step(*batch, tf.constant(lr, tf.float32))
                loss, right = float(loss), int(right)
            if not np.isfinite(loss):
                raise Diverged(loss, epoch, i + 1, steps)
            n = int(batch[-1].shape[0])  # Labels, or indices: one per example.
            loss_sum += loss * n
            correct += right
            seen += n
            global_step += 1
            progress.update(i + 1, [("loss", loss_sum / seen), ("train_acc", correct / seen)])
        seconds = time.perf_counter() - start
        with busy(f"evaluating epoch {epoch + 1}"):
            test_loss, test_acc = evaluate(eval_step, feed.eval_batches(), plan)
        reporter.epoch_end(epoch, loss=loss_sum / seen, train_acc=correct / seen,
                           test_loss=test_loss, test_acc=test_acc, seconds=seconds, examples=seen,
                           resumed_at=first)
        saved = backups.save(global_step, weights()) if backups else None
        if watch and watch.requested:
            raise Preempted(global_step, saved)
    if watch:
        watch.training, watch.step = False, global_step
    return trained()


def count_correct(logits, labels):
    """How many of ``labels`` the ``logits`` rank first, as an int64 scalar."""
    return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.int64))


def serving_model(params: dict, precision: str = "float32"):
    """The trained parameters in LeNet's Keras twin, for ``tfdp.export``: float32, or mixed
    bfloat16 like the training that made them."""
    model = lenet.keras_model(precision="bfloat16" if precision == "bfloat16" else "float32")
    model.set_weights(lenet.to_keras_weights(
        {name: np.asarray(value, np.float32) for name, value in params.items()}))
    return model
