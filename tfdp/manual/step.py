"""The from-scratch step: the textbook's algorithm, one visible step at a time.

Every step: split the global batch across the devices; on each device, a forward and backward
pass of its own replica under its own ``GradientTape``, with the loss summed over its shard and
divided by the *global* batch size (so the per-device gradients add up to the gradient of the
mean loss); an allreduce sums the gradients; every replica applies the same SGD update and so
stays identical to the others. The step is compiled with ``tf.function`` unless ``eager``.

Gradient accumulation (``accumulate``, K): each device cuts its shard into K micro-batches and
runs them one after the other, summing their gradients locally; the allreduce runs once per
update, on the sum (the K-1 micro-steps before it send nothing: DDP's ``no_sync``). Since every
loss is divided by the whole update's batch, the sum is the gradient of the mean loss over it:
K micro-batches of B train the model one batch of K x B would, to rounding, with the memory of
one micro-batch (each waits for the previous one's gradients).

The update is ``tfdp.models.sgd``'s (Keras' SGD: momentum, Nesterov, weight decay), each
replica's velocities beside its parameters. lenet_bn normalizes each replica's shard by the
shard's own statistics (as Keras under MirroredStrategy does); its running statistics move by
the mean of the replicas' batch statistics, weighted by their shards' sizes, the same on every
replica (as ``ReplicatedBatchNormalization`` moves Keras'), so what is evaluated on any replica
is what is exported.

A window of steps (``make_train_window``) runs ``count`` steps in one compiled call, a loop in
the graph that takes each batch from the input iterator and each step's learning rate from the
plan: the host issues one call per ``--sync_every`` steps and reads their losses together
(section 12.2).
"""

import dataclasses
from typing import Optional

import tensorflow as tf

from tfdp.manual.allreduce import ALLREDUCE, on_replica
from tfdp.manual.buckets import exchange
from tfdp.manual.feed import Feed, images_feed
from tfdp.manual.replicate import Replicas
from tfdp.models import lenet
from tfdp.models.averaging import Averaging
from tfdp.models.loss import count_correct, summed_cross_entropy, test_logits
from tfdp.models.sgd import SGD
from tfdp.plan import shard_sizes
from tfdp.trace.arrivals import stamp_after


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """What a from-scratch step does, read from the config once (``of``): the allreduce and
    when it runs, the dtypes of the passes and of the gradients' travel (None: the
    parameters'), micro-batches per update, the update, the loss's label smoothing, the
    weight averaging, and whether the step is compiled."""
    allreduce: str = "add_n"
    compute_dtype: Optional[str] = None
    allreduce_dtype: Optional[str] = None
    accumulate: int = 1
    bucket_kb: Optional[int] = None
    overlap: bool = True
    sgd: SGD = SGD()
    smoothing: float = 0.0
    averaging: Averaging = Averaging()
    eager: bool = False
    eval_flip: bool = False

    @classmethod
    def of(cls, config) -> "StepSettings":
        return cls(config.allreduce, config.precision,
                   # float32 is the gradients' own dtype (float64 under --precision=float64).
                   config.allreduce_dtype if config.allreduce_dtype == "bfloat16" else None,
                   config.accumulate_steps, config.bucket_kb, config.overlap == "auto",
                   SGD.of(config), config.label_smoothing, Averaging(config.ema), config.eager,
                   config.eval_flip)


def make_train_step(replicas: Replicas, settings: StepSettings = StepSettings(),
                    feed: Feed = None):
    """``step(*batch, lr) -> (loss, correct, times)`` over the global batch: the textbook's
    three stages, each a function of its own: every replica's gradients on its shard
    (``replica_gradients``), their exchange (``exchange_gradients``), the same update on every
    replica (``update_replicas``). ``times[d]`` is (start, gradients ready) of replica d, in
    Unix seconds (``tfdp.trace.arrivals``). The batch is ``(images, labels)`` unless a ``feed``
    says otherwise."""
    feed = feed or images_feed(replicas.devices)
    dtype = replicas.params[0]["W1"].dtype

    def step(*batch_and_lr):
        *batch, lr = batch_and_lr
        with tf.name_scope("input"):
            shards = feed.shards("train", *batch)
        n = tf.cast(tf.shape(batch[-1])[0], dtype)  # Labels, or indices: both one per example.
        shard_results = replica_gradients(replicas, shards, n, settings)
        with tf.name_scope("allreduce"):
            summed = exchange_gradients([r.gradients for r in shard_results], replicas.devices,
                                        settings)
        statistics = moved_statistics(replicas, shard_results)
        update_replicas(replicas, summed, statistics, lr, settings)
        return (tf.add_n([r.loss for r in shard_results]),
                tf.add_n([r.correct for r in shard_results]),
                tf.stack([r.times for r in shard_results]))

    if settings.eager:
        return step
    return tf.function(step, input_signature=[*feed.signature, tf.TensorSpec([], tf.float32)])


@dataclasses.dataclass
class ShardResult:
    """One replica's part of a step: its loss share, correct answers, (start, gradients ready)
    times, gradients, and lenet_bn's batch statistics with its shard's size."""
    loss: tf.Tensor
    correct: tf.Tensor
    times: tf.Tensor
    gradients: list
    statistics: list
    size: tf.Tensor


def replica_gradients(replicas: Replicas, shards: list, global_batch,
                      settings: StepSettings = StepSettings()) -> list:
    """On each device, its replica's forward and backward pass on its shard, under its own
    tape (in ``settings.accumulate`` micro-batches): one ``ShardResult`` per replica. The loss
    is summed over the shard and divided by the global batch, so the gradients add up to the
    mean loss's."""
    dtype = replicas.params[0]["W1"].dtype
    compute = tf.as_dtype(settings.compute_dtype or dtype)
    trained = len(lenet.trainable(replicas.params[0]))
    results = []
    for d, (params, (x, y)) in enumerate(zip(replicas.params, shards)):
        with on_replica(replicas.devices, d):
            loss, right, started, *g = _unless_empty(
                y, _stamped(lambda: _accumulated_gradients(params, x, y, global_batch, compute,
                                                           settings.accumulate,
                                                           settings.smoothing)),
                _stamped(lambda: _no_gradients(params)))
            g, stats = g[:trained], g[trained:]
            ready = stamp_after(tf.math.is_finite(loss), g, params["b4"])
            results.append(ShardResult(loss, right, tf.stack([started, ready]), g, stats,
                                       tf.cast(tf.size(y), dtype)))
    return results


def exchange_gradients(grads: list, devices: list,
                       settings: StepSettings = StepSettings()) -> list:
    """The allreduce of ``settings`` over ``grads[d][i]`` (gradient i of replica d), in its
    travel dtype, buckets and overlap (``tfdp.manual.buckets``): every device's sums."""
    travel = settings.allreduce_dtype
    if travel and tf.as_dtype(travel) != grads[0][0].dtype:
        grads = [_cast_on(devices, d, g, tf.as_dtype(travel)) for d, g in enumerate(grads)]
    return exchange(grads, devices, ALLREDUCE[settings.allreduce], settings.bucket_kb,
                    settings.overlap)


def update_replicas(replicas: Replicas, summed: list, statistics: dict, lr,
                    settings: StepSettings = StepSettings()) -> None:
    """The same update on every replica: SGD with the summed gradients (cast back to the
    parameters' dtype), lenet_bn's moved running statistics, then the weight averages."""
    for d, (params, g) in enumerate(zip(replicas.params, summed)):
        with on_replica(replicas.devices, d), tf.name_scope("update"):
            for (name, var), grad in zip(lenet.trainable(params).items(), g):
                with tf.name_scope(name):  # update/<name>/: the trace names it.
                    settings.sgd.update(var, grad, lr, replicas.velocities[d].get(name))
            for name, value in statistics.items():
                params[name].assign(value)
            for name, average in replicas.averages[d].items():
                settings.averaging.update(average, params[name], replicas.averaged)
    replicas.averaged.assign(True)


def moved_statistics(replicas: Replicas, shard_results: list) -> dict:
    """lenet_bn's running statistics after this step, {name: value}: the mean of the
    replicas' batch statistics weighted by their shards' sizes (none for lenet)."""
    if not shard_results[0].statistics:
        return {}
    with on_replica(replicas.devices, 0), tf.name_scope("batch_norm_statistics"):
        total = tf.add_n([r.size for r in shard_results])
        mean = [tf.add_n([r.size * r.statistics[k] for r in shard_results]) / total
                for k in range(len(shard_results[0].statistics))]
        return lenet.moved_statistics(replicas.params[0], list(zip(mean[::2], mean[1::2])))


def _cast_on(devices, d, tensors, dtype) -> list:
    with on_replica(devices, d):
        return [tf.cast(t, dtype) for t in tensors]


def make_train_window(step, plan, eager: bool = False):
    """``window(batches, first_step, count) -> (losses, correct, examples, times)``:
    ``count`` calls of ``step`` on the next batches of the iterator ``batches``, global step
    ``first_step + i`` at the plan's learning rate of that step; one entry per step in each
    result."""
    def window(batches, first_step, count):
        losses = tf.TensorArray(tf.float64, size=count)  # Exact for float32 and float64.
        right = tf.TensorArray(tf.int64, size=count)
        examples = tf.TensorArray(tf.int32, size=count)
        arrivals = tf.TensorArray(tf.float64, size=count)
        for i in tf.range(count):
            batch = next(batches)
            lr = tf.cast(plan.learning_rate(first_step + tf.cast(i, tf.int64)), tf.float32)
            loss, correct, times = step(*batch, lr)
            losses = losses.write(i, tf.cast(loss, tf.float64))
            right = right.write(i, correct)
            examples = examples.write(i, tf.shape(batch[-1])[0])
            arrivals = arrivals.write(i, times)
        return losses.stack(), right.stack(), examples.stack(), arrivals.stack()

    return window if eager else tf.function(window)


def _stamped(shard_gradients):
    """``shard_gradients()`` and the time (on the device's own clock) it started: (loss,
    correct, start, *gradients)."""
    def run():
        started = tf.timestamp()
        with tf.control_dependencies([started]):
            loss, right, *grads = shard_gradients()
        return [loss, right, started, *grads]

    return run


def _no_gradients(params: dict) -> list:
    """An empty shard's (loss share, correct, gradients, batch statistics): zeros."""
    dtype = params["W1"].dtype
    return [tf.zeros([], dtype), tf.zeros([], tf.int64),
            *[tf.zeros_like(v) for v in lenet.trainable(params).values()],
            *[tf.zeros_like(params[name]) for name in lenet.STATISTICS if name in params]]


def _accumulated_gradients(params: dict, x, y, global_batch, compute, accumulate: int,
                           smoothing: float = 0.0):
    """One device's shard in ``accumulate`` micro-batches, one after the other (each starts
    once the previous one's gradients exist, so only one micro-batch's activations live at a
    time): (summed loss share, correct, summed gradients)."""
    if accumulate == 1:
        return _shard_gradients(params, x, y, global_batch, compute, smoothing)
    sizes = tf.stack(shard_sizes(tf.shape(y)[0], accumulate))
    total = None
    for micro_x, micro_y in zip(tf.split(x, sizes, num=accumulate),
                                tf.split(y, sizes, num=accumulate)):
        with tf.control_dependencies(total or []):
            micro_x = tf.identity(micro_x)
        part = _unless_empty(micro_y, lambda: _shard_gradients(params, micro_x, micro_y,
                                                               global_batch, compute,
                                                               smoothing),
                             lambda: _no_gradients(params))
        total = part if total is None else [a + b for a, b in zip(total, part)]
    return total


def _shard_gradients(params: dict, x, y, global_batch, compute, smoothing: float = 0.0):
    """One device's forward and backward pass: (loss share, correct, gradients, and lenet_bn's
    batch statistics: mean and variance per layer)."""
    batch_stats = []
    with tf.GradientTape() as tape, tf.name_scope("forward"):
        logits = lenet.logits(params, x, compute, batch_stats)
        # / global batch: the replicas' gradients add up to the mean loss's.
        loss = summed_cross_entropy(logits, y, smoothing) / global_batch
    with tf.name_scope("backward"):
        grads = tape.gradient(loss, list(lenet.trainable(params).values()))
    return [loss, count_correct(logits, y), *grads,
            *[tf.cast(t, params["W1"].dtype) for pair in batch_stats for t in pair]]


def make_eval_step(replicas: Replicas, settings: StepSettings = StepSettings(),
                   feed: Feed = None):
    """``step(*batch) -> (summed loss, correct)`` of the model as evaluated
    (``Replicas.evaluated``), the batch split like in training; with ``settings.eval_flip`` the
    logits are the mean of each image's and its mirror image's."""
    dtype = replicas.params[0]["W1"].dtype
    feed = feed or images_feed(replicas.devices)

    def shard_sums(params, x, y):
        logits = test_logits(lambda images: lenet.logits(params, images,
                                                         settings.compute_dtype),
                             x, settings.eval_flip)
        return [summed_cross_entropy(logits, y), count_correct(logits, y)]

    def step(*batch):
        losses, correct = [], []
        for device, params, (x, y) in zip(replicas.devices, replicas.evaluated(),
                                          feed.shards("test", *batch)):
            with tf.device(device):
                loss, right = _unless_empty(y, lambda: shard_sums(params, x, y),
                                            lambda: [tf.zeros([], dtype), tf.zeros([], tf.int64)])
                losses.append(loss)
                correct.append(right)
        return tf.add_n(losses), tf.add_n(correct)

    return step if settings.eager else tf.function(step, input_signature=feed.signature)


def _unless_empty(labels, compute, zeros) -> list:
    """``compute()``, or ``zeros()`` when this device's shard is empty (a global batch smaller
    than the device count): an empty shard contributes nothing, and never reaches a kernel
    (oneDNN's convolution refuses an empty batch)."""
    return tf.cond(tf.size(labels) > 0, compute, zeros)
