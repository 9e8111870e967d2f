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

The update is ``--optimizer``'s, written out (``tfdp.models.optimizers``: Keras' SGD, Adam,
AdamW, RMSprop, Lion), each replica's slots beside its parameters. The model is any
``tfdp.models.stateless`` one: the hand-written LeNet, or a Keras model through
``stateless_call``. The model's own losses (regularizers, ``add_loss``) join each replica's
loss divided by the replica count (and the micro-batches), as Keras' ``fit`` scales them under
a strategy, so the summed gradients count them once per update. Batch normalization normalizes
each replica's shard by the shard's own statistics (as Keras under MirroredStrategy does); its
running statistics move by the mean of the replicas' moved statistics, weighted by their
shards' sizes, the same on every replica (as ``ReplicatedBatchNormalization`` moves Keras'),
so what is evaluated on any replica is what is exported. Each random layer's seed state
(Dropout's) is the same on every replica and moves as Keras moves it under
``MirroredStrategy``: every replica draws from the same seed each step (so equal shards draw
equal masks), and the seed advances once per step (per micro-batch under accumulation).

The trainer calls the step in windows of several steps (``tfdp.paths.manual.window``); the evaluation
step is ``tfdp.paths.manual.evaluation``'s.
"""

import dataclasses
from typing import Optional

import tensorflow as tf

from tfdp.config.plan import shard_sizes
from tfdp.models.averaging import Averaging
from tfdp.models.loss import count_correct, summed_cross_entropy
from tfdp.models.optimizers import Optimizer
from tfdp.paths.manual.allreduce import ALLREDUCE, on_replica
from tfdp.paths.manual.buckets import exchange
from tfdp.paths.manual.feed import TRAIN, Feed, images_feed
from tfdp.paths.manual.replicate import Replicas
from tfdp.trace.arrivals import stamp_after


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """What a from-scratch step does, read from the config once (``of``): the allreduce and
    when it runs, the dtype of the gradients' travel (None: the parameters'), micro-batches
    per update, the optimizer, the loss's label smoothing, the weight averaging, and whether the
    step is compiled. (The passes' dtype is the model's: ``tfdp.models.stateless``.)"""
    allreduce: str = "add_n"
    allreduce_dtype: Optional[str] = None
    accumulate: int = 1
    bucket_kb: Optional[int] = None
    overlap: bool = True
    optimizer: Optimizer = Optimizer()
    smoothing: float = 0.0
    averaging: Averaging = Averaging()
    eager: bool = False
    eval_flip: bool = False
    jit_compile: bool = False

    @classmethod
    def of(cls, config) -> "StepSettings":
        return cls(config.allreduce,
                   # float32 is the gradients' own dtype (float64 under --precision=float64).
                   config.allreduce_dtype if config.allreduce_dtype == "bfloat16" else None,
                   config.accumulate_steps, config.bucket_kb, config.overlap == "auto",
                   Optimizer.of(config), config.label_smoothing, Averaging(config.ema), config.eager,
                   config.eval_flip, config.jit_compile)


def make_train_step(replicas: Replicas, settings: StepSettings = StepSettings(),
                    feed: Feed = None):
    """``step(*batch, lr) -> (loss, correct, times)`` over the global batch: the textbook's
    three stages, each a function of its own: every replica's gradients on its shard
    (``replica_gradients``), their exchange (``exchange_gradients``), the same update on every
    replica (``update_replicas``). ``times[d]`` is (start, gradients ready) of replica d, in
    Unix seconds (``tfdp.trace.arrivals``). The batch is ``(images, labels)`` unless a ``feed``
    says otherwise."""
    feed = feed or images_feed(replicas.devices)
    dtype = replicas.dtype

    def step(*batch_and_lr):
        *batch, lr = batch_and_lr
        with tf.name_scope("input"):
            shards = feed.shards(TRAIN, *batch)
        n = tf.cast(tf.shape(batch[-1])[0], dtype)  # Labels, or indices: both one per example.
        shard_results = replica_gradients(replicas, shards, n, settings)
        with tf.name_scope("allreduce"):
            summed = exchange_gradients([r.gradients for r in shard_results], replicas.devices,
                                        settings)
        statistics = combined_statistics(replicas, shard_results)
        update_replicas(replicas, summed, statistics, lr, settings)
        return (tf.add_n([r.loss for r in shard_results]),
                tf.add_n([r.correct for r in shard_results]),
                tf.stack([r.times for r in shard_results]))

    if settings.eager:
        return step
    # Without AutoGraph: nothing in the step needs converting, and it would transform the source
    # of every function the step calls, again in every process (docs/design.md#compiled-steps).
    return tf.function(step, input_signature=[*feed.signature, tf.TensorSpec([], tf.float32)],
                       autograph=False)


@dataclasses.dataclass
class ShardResult:
    """One replica's part of a step: its loss share, correct answers, (start, gradients ready)
    times, gradients, and the model's running statistics moved by its shard (batch
    normalization's), with the shard's size."""
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
    is summed over the shard and divided by the global batch, and the model's own losses
    divided by the replica count, so the gradients add up to the mean loss's plus the model's
    losses once."""
    model, dtype = replicas.model, replicas.dtype
    trained = len(model.trainable)
    results = []
    for d, (params, (x, y)) in enumerate(zip(replicas.params, shards)):
        with on_replica(replicas.devices, d):
            loss, right, started, *g = unless_empty(
                y, _stamped(lambda: _accumulated_gradients(model, params, x, y, global_batch,
                                                           settings, len(replicas.devices))),
                _stamped(lambda: _no_gradients(model, params)))
            g, stats = g[:trained], g[trained:]
            ready = stamp_after(tf.math.is_finite(loss), g, params[model.trainable[-1]])
            results.append(ShardResult(loss, right, tf.stack([started, ready]), g, stats,
                                       tf.cast(tf.size(y), dtype)))
    return results


def exchange_gradients(grads: list, devices: list,
                       settings: StepSettings = StepSettings()) -> list:
    """The allreduce of ``settings`` over ``grads[d][i]`` (gradient i of replica d), in its
    travel dtype, buckets and overlap (``tfdp.paths.manual.buckets``): every device's sums."""
    travel = settings.allreduce_dtype
    if travel and tf.as_dtype(travel) != grads[0][0].dtype:
        grads = [_cast_on(devices, d, g, tf.as_dtype(travel)) for d, g in enumerate(grads)]
    return exchange(grads, devices, ALLREDUCE[settings.allreduce], settings.bucket_kb,
                    settings.overlap)


def update_replicas(replicas: Replicas, summed: list, statistics: dict, lr,
                    settings: StepSettings = StepSettings()) -> None:
    """The same update on every replica: the optimizer's with the summed gradients (cast back
    to the parameters' dtype) at the step count ``replicas.iterations``, the moved running
    statistics and seed states, then the weight averages."""
    step = replicas.iterations.read_value()
    for d, (params, g) in enumerate(zip(replicas.params, summed)):
        began, finished = replicas.marks[d]
        with on_replica(replicas.devices, d):
            # Marked begun once all it needs has come (the exchanged gradients and statistics):
            # from here the update is the replica's own, so a loss elsewhere leaves it whole.
            with tf.name_scope("step_marks"), tf.control_dependencies([*g, *statistics.values()]):
                begun = began.assign(step + 1)
            with tf.name_scope("update"), tf.control_dependencies([begun]):
                for (name, var), grad in zip(replicas.trainable(d).items(), g):
                    with tf.name_scope(name):  # update/<name>/: the trace names it.
                        settings.optimizer.update(var, grad, lr,
                                                  replicas.slots[d].get(name, ()), step)
                for name, value in statistics.items():
                    params[name].assign(tf.cast(value, params[name].dtype))
                for name, average in replicas.averages[d].items():
                    settings.averaging.update(average, params[name], replicas.averaged)
            # Reads come after the writes to the same variable (automatic control dependencies).
            state = [*params.values(), *replicas.averages[d].values(),
                     *(slot for slots in replicas.slots[d].values() for slot in slots)]
            with tf.name_scope("step_marks"), tf.control_dependencies(
                    [v.read_value() for v in state]):
                finished.assign(step + 1)
    replicas.averaged.assign(True)
    replicas.iterations.assign_add(1)


def combined_statistics(replicas: Replicas, shard_results: list) -> dict:
    """The model's running statistics after this step, {name: value}, the same for every
    replica: the mean of the replicas' moved statistics, weighted by their shards' sizes (a
    moving average moved by the mean of the batches' statistics, as
    ``ReplicatedBatchNormalization`` moves Keras'); a statistic that does not move with the
    batches (not in ``model.moving``: a layer's seed) replica 0's."""
    names = replicas.model.statistics
    if not names:
        return {}
    with on_replica(replicas.devices, 0), tf.name_scope("batch_norm_statistics"):
        combined = {}
        for k, name in enumerate(names):
            values = [r.statistics[k] for r in shard_results]
            if name not in replicas.model.moving:
                combined[name] = values[0]
                continue
            sizes = [tf.cast(r.size, values[0].dtype) for r in shard_results]
            combined[name] = (tf.add_n([n * v for n, v in zip(sizes, values)])
                              / tf.add_n(sizes))
        return combined


def _cast_on(devices, d, tensors, dtype) -> list:
    with on_replica(devices, d):
        return [tf.cast(t, dtype) for t in tensors]


def _stamped(shard_gradients):
    """``shard_gradients()`` and the time (on the device's own clock) it started: (loss,
    correct, start, *gradients)."""
    def run():
        started = tf.timestamp()
        with tf.control_dependencies([started]):
            loss, right, *grads = shard_gradients()
        return [loss, right, started, *grads]

    return run


def _no_gradients(model, params: dict) -> list:
    """An empty shard's (loss share, correct, gradients, statistics): zeros, and the
    statistics unmoved (they weigh nothing in ``combined_statistics``)."""
    dtype = params[model.trainable[0]].dtype
    return [tf.zeros([], dtype), tf.zeros([], tf.int64),
            *[tf.zeros_like(params[name]) for name in model.trainable],
            *[tf.identity(params[name]) for name in model.statistics]]


def _accumulated_gradients(model, params: dict, x, y, global_batch, settings: StepSettings,
                           replicas_in_sync: int = 1):
    """One device's shard in ``settings.accumulate`` micro-batches, one after the other (each
    starts once the previous one's gradients exist, so only one micro-batch's activations live
    at a time, and with the seed states the previous one moved): (summed loss share, correct,
    summed gradients, the last micro-batch's statistics: a model whose statistics are batch
    normalization's is not accumulated, ``tfdp.paths.manual.trainer``). Each micro-batch's pass is
    one XLA computation under ``settings.jit_compile``."""
    accumulate = settings.accumulate
    # The model's own losses count once per update: a share in each micro-batch.
    own_share = replicas_in_sync * accumulate

    def shard_gradients(x, y, global_batch, states):
        return _shard_gradients(model, {**params, **states}, x, y, global_batch,
                                settings.smoothing, own_share)

    if settings.jit_compile:
        shard_gradients = tf.function(shard_gradients, jit_compile=True, autograph=False)
    if accumulate == 1:
        return shard_gradients(x, y, global_batch, {})
    sizes = tf.stack(shard_sizes(tf.shape(y)[0], accumulate))
    summed = 2 + len(model.trainable)
    total, states = None, {}
    for micro_x, micro_y in zip(tf.split(x, sizes, num=accumulate),
                                tf.split(y, sizes, num=accumulate)):
        with tf.control_dependencies(total or []):
            micro_x = tf.identity(micro_x)
        part = unless_empty(
            micro_y, lambda: shard_gradients(micro_x, micro_y, global_batch, states),
            lambda: _no_gradients(model, {**params, **states}))
        total = part if total is None else (
            [a + b for a, b in zip(total[:summed], part[:summed])] + part[summed:])
        moved = dict(zip(model.statistics, part[summed:]))
        states = {name: moved[name] for name in model.states}
    return total


def _shard_gradients(model, params: dict, x, y, global_batch, smoothing: float = 0.0,
                     own_share: int = 1):
    """One device's forward and backward pass: (loss share, correct, gradients, and the
    model's statistics moved by the shard). The model's own losses weigh 1 / ``own_share``."""
    with tf.GradientTape() as tape, tf.name_scope("forward"):
        logits, moved, own = model.forward(params, x, training=True)
        # / global batch: the replicas' gradients add up to the mean loss's.
        loss = summed_cross_entropy(logits, y, smoothing) / global_batch
        if own is not None:  # Regularizers and add_loss, as fit adds them: once per update.
            loss += own / tf.constant(own_share, own.dtype)
    with tf.name_scope("backward"):
        grads = tape.gradient(loss, [params[name] for name in model.trainable])
    return [loss, count_correct(logits, y), *grads,
            *[tf.cast(moved[name], params[name].dtype) for name in model.statistics]]


def unless_empty(labels, compute, zeros) -> list:
    """``compute()``, or ``zeros()`` when this device's shard is empty (a global batch smaller
    than the device count): an empty shard contributes nothing, and never reaches a kernel
    (oneDNN's convolution refuses an empty batch)."""
    return tf.cond(tf.size(labels) > 0, compute, zeros)
