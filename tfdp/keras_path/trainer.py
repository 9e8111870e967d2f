"""The Keras path: build and compile in the strategy scope, ``model.fit``, report, export.

Batches come from the same ``data.train_batches`` as the manual path, and each global batch is
cut into per-replica shards exactly like ``split_batch`` (``distributed_input``), so with
equal starting weights the two paths train the same model.
"""

import hashlib
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from tfdp import checkpoints, cluster, data, export, paths, preemption, schedule
from tfdp.errors import UserError
from tfdp.keras_path import evaluation, keras_mwms_fix
from tfdp.keras_path.distributed_input import distribute
from tfdp.keras_path.guard import Guard
from tfdp.keras_path.strategy import make_distribution
from tfdp.keras_path.train_step import global_batch_model
from tfdp.logs import logger
from tfdp.models import lenet, resnet
from tfdp.models.precision import input_dtype
from tfdp.plan import steps_per_epoch


def build_model(config):
    """The Keras model in ``--precision``, trained with tfdp's step (``train_step.py``)."""
    if config.model == "resnet18":
        return global_batch_model(resnet.resnet(sync_batch_norm=config.sync_batch_norm,
                                                precision=config.precision))
    model = global_batch_model(lenet.keras_model(precision=config.precision))
    # The same starting weights as the manual path for the same --init and --seed.
    model.set_weights(lenet.to_keras_weights(lenet.start_params(config.initializer, config.seed)))
    return model


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``tfdp.schedule.learning_rate`` as a Keras schedule (the optimizer's step counter)."""

    def __init__(self, base_lr, peak_lr, warmup):
        self.base_lr, self.peak_lr, self.warmup = base_lr, peak_lr, warmup

    def __call__(self, step):
        return schedule.learning_rate(step, self.base_lr, self.peak_lr, self.warmup)

    def get_config(self):
        return {"base_lr": self.base_lr, "peak_lr": self.peak_lr, "warmup": self.warmup}


class EpochReport(keras.callbacks.Callback):
    """The shared ``Reporter``'s progress line and epoch line, as on the manual path: times
    each epoch's training, then evaluates. (fit runs with ``verbose=0``: Keras' own bar would
    print its line around tfdp's and under other metric names.) ``first_step`` is where the
    first epoch starts when a run resumes within it."""

    def __init__(self, reporter, evaluator, plan, first_step: int = 0):
        super().__init__()
        self.reporter, self.evaluator, self.steps = reporter, evaluator, plan.steps_per_epoch
        self.batch = plan.global_batch
        self.examples = min(plan.steps_per_epoch * plan.global_batch, plan.train_examples)
        self.first_step = first_step

    def on_epoch_begin(self, epoch, logs=None):
        self._progress = self.reporter.progress(epoch, self.steps)
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if not self._progress.live:  # Reading the logs would wait for the step: skip.
            return
        self._progress.update(self.first_step + batch + 1,
                              [("loss", float(logs["loss"])),
                               ("train_acc", float(logs["accuracy"]))])

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._start  # Training only: evaluation comes next.
        test_loss, test_acc = self.evaluator.evaluate()
        examples = min((self.steps - self.first_step) * self.batch, self.examples)
        self.reporter.epoch_end(epoch, loss=logs["loss"], train_acc=logs["accuracy"],
                                test_loss=test_loss, test_acc=test_acc, seconds=seconds,
                                examples=examples, resumed_at=self.first_step)
        self.first_step = 0


def run(config, start_weights=None):
    """Train ``config.model`` with Keras fit under ``config.strategy``; export from the chief
    (``tfdp.paths``). ``start_weights`` (Keras weights) override ``config.initializer``. A run
    given the folder of an interrupted one resumes from the newest step every worker backed up."""
    distribution = make_distribution(config.strategy, config.num_gpus, config.collective_timeout)
    if config.strategy != "plain":
        keras_mwms_fix.apply()
    with preemption.Watch() as watch:
        backups = checkpoints.Backups(config.run_dir, distribution.worker_index, config.identity)
        try:
            first_step = checkpoints.resume_step(backups, gather=_gather_steps(distribution)
                                                 if distribution.num_workers > 1 else None)
        finally:
            distribution.started()  # Every worker has answered (or this one gave up).
        try:
            result = _train_and_export(config, distribution, backups, first_step, watch,
                                       start_weights)
        except _PEER_LOST as e:
            if distribution.num_workers == 1:
                raise
            raise _cluster_lost(e, backups) from None
    backups.clear()
    return result


# What a collective raises when a peer has died or cannot be reached (heartbeats stopped, the
# collective timed out, or the coordination service aborted it).
_PEER_LOST = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
              tf.errors.AbortedError, tf.errors.CancelledError)


def _cluster_lost(error, backups) -> UserError:
    return UserError(cluster.lost_contact(type(error).__name__, cluster.task().peers,
                                          str(error.message), backups.steps()))


def _train_and_export(config, distribution, backups, first_step, watch, start_weights):
    strategy, replicas = distribution.strategy, distribution.replicas
    started = paths.start(config, _device_names(distribution), replicas,
                          engine=distribution.describe(), is_chief=distribution.is_chief,
                          first_step=first_step)
    plan = started.plan
    with strategy.scope():
        model = build_model(config)
        if first_step:
            model.set_weights(backups.load(first_step))
        elif start_weights is not None:
            model.set_weights(start_weights)
        model.compile(optimizer=keras.optimizers.SGD(
                          WarmupSchedule(plan.base_lr, plan.peak_lr, plan.warmup_steps)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], run_eagerly=config.eager,
                      steps_per_execution=config.steps_per_execution)
        model.optimizer.build(model.trainable_variables)
        model.optimizer.iterations.assign(first_step)  # The schedule goes on from here.

    first_epoch, offset = divmod(first_step, plan.steps_per_epoch)
    if first_epoch < config.epochs:
        # Evaluated by EpochReport with one iterator for the run, not by fit (evaluation.py).
        test = data.eval_batches(started.test_split, plan.global_batch, config.eval_steps)
        evaluator = evaluation.Evaluator(
            model, strategy, distribute(strategy, test, replicas, input_dtype(config.precision)),
            steps=steps_per_epoch(plan.eval_examples, plan.global_batch))
        report = EpochReport(started.reporter, evaluator, plan, first_step=offset)
        guard = Guard(watch, backups, distribution, plan.steps_per_epoch)
        watch.step, watch.training = first_step, True
        # fit's epochs all have steps_per_epoch steps: a resume within an epoch first fits the
        # rest of that epoch alone, then the epochs after it.
        parts = ([(first_epoch, first_epoch + 1, offset)] if offset else []) + [
            (first_epoch + (1 if offset else 0), config.epochs, 0)]
        for begin, end, skip in parts:
            if begin >= end:
                continue
            train = data.train_batches(started.train_split, plan.global_batch, config.seed,
                                       begin, end, config.steps_per_epoch).skip(skip)
            model.fit(
                distribute(strategy, train, replicas, input_dtype(config.precision)), epochs=end,
                initial_epoch=begin, steps_per_epoch=plan.steps_per_epoch - skip,
                shuffle=False, verbose=0,  # Shuffled already; tfdp's reporter draws progress.
                callbacks=[report, guard])
        watch.training = False
    weights = model.get_weights()
    if distribution.num_workers > 1:
        # Every worker logs this: equal digests show the replicas really ended identical.
        logger.info("final weights sha256 %s (worker %d)", hashlib.sha256(
            b"".join(w.tobytes() for w in weights)).hexdigest()[:16], distribution.worker_index)
    result = paths.finish(started, weights, backups=backups,
                          export=lambda: _export(model, distribution, config.export_root))
    if distribution.num_workers > 1:
        _barrier(strategy)  # Finish together: a chief exiting first upsets the others' heartbeat.
    return result


def _gather_steps(distribution, slots: int = checkpoints.KEEP + 1):
    """``gather(steps) -> [steps of every worker]``: one all-reduce, each worker filling its row."""
    strategy = distribution.strategy

    @tf.function  # Collectives run eagerly are slow and warn about it.
    def all_rows(rows):
        return strategy.reduce("SUM", strategy.run(lambda r: r, args=(rows,)), axis=None)

    def gather(steps):
        rows = np.zeros([distribution.num_workers, slots], np.int64)
        mine = np.asarray(steps[:slots], np.int64) + 1  # 0 stands for "no backup".
        rows[distribution.worker_index, :len(mine)] = mine
        # Every local replica adds the rows once.
        everyone = all_rows(tf.constant(rows)).numpy() // len(distribution.devices)
        return [[int(s) - 1 for s in row if s > 0] for row in everyone]

    return gather


def _export(model, distribution, export_root):
    """The chief writes the next version; the others save to a scratch folder they delete,
    because saving distributed variables is a collective every worker must join."""
    if distribution.is_chief:
        return export.export(model, export_root)
    export.save_scratch(model, tempfile.mkdtemp(prefix=f"tfdp-worker{distribution.worker_index}-"))
    return None


@tf.function
def _barrier_step(strategy):
    return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1)), axis=None)


def _barrier(strategy):
    _barrier_step(strategy)


def _device_names(distribution):
    if distribution.num_workers == 1:
        return distribution.devices
    return [f"/job:worker/task:{i}" for i in range(distribution.num_workers)]
