"""The Keras path: build and compile in the strategy scope, ``model.fit``, report, export.

Batches come from the same ``data.train_batches`` as the manual path, and each global batch is
cut into per-replica shards exactly like ``split_batch`` (``distributed_input``), so with
equal starting weights the two paths train the same model.
"""

import hashlib
import shutil
import tempfile
import time

import keras
import tensorflow as tf

from tfdp import data, export, paths, schedule
from tfdp.keras_path import backup, evaluation, keras_mwms_fix
from tfdp.keras_path.distributed_input import distribute
from tfdp.keras_path.strategy import make_distribution
from tfdp.keras_path.train_step import global_batch_model
from tfdp.logs import logger
from tfdp.models import lenet, resnet
from tfdp.plan import steps_per_epoch


def build_model(config):
    """The Keras model in ``--precision``, trained with tfdp's step (``train_step.py``)."""
    if config.model == "resnet18":
        return global_batch_model(resnet.resnet(sync_batch_norm=config.sync_batch_norm,
                                                dtype=config.precision))
    model = global_batch_model(lenet.keras_model(dtype=config.precision))
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
    print its line around tfdp's and under other metric names.)"""

    def __init__(self, reporter, evaluator, plan):
        super().__init__()
        self.reporter, self.evaluator, self.steps = reporter, evaluator, plan.steps_per_epoch
        self.examples = min(plan.steps_per_epoch * plan.global_batch, plan.train_examples)

    def on_epoch_begin(self, epoch, logs=None):
        self._progress = self.reporter.progress(epoch, self.steps)
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if not self._progress.live:  # Reading the logs would wait for the step: skip.
            return
        self._progress.update(batch + 1, [("loss", float(logs["loss"])),
                                          ("train_acc", float(logs["accuracy"]))])

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._start  # Training only: evaluation comes next.
        test_loss, test_acc = self.evaluator.evaluate()
        self.reporter.epoch_end(epoch, loss=logs["loss"], train_acc=logs["accuracy"],
                                test_loss=test_loss, test_acc=test_acc, seconds=seconds,
                                examples=self.examples)


def run(config, start_weights=None):
    """Train ``config.model`` with Keras fit under ``config.strategy``; export from the chief
    (``tfdp.paths``). ``start_weights`` (Keras weights) override ``config.initializer``."""
    distribution = make_distribution(config.strategy, config.num_gpus, config.collective_timeout)
    if config.strategy != "plain":
        keras_mwms_fix.apply()
    strategy, replicas = distribution.strategy, distribution.replicas
    folder = backup.worker_folder(config.run_dir, distribution.worker_index)
    first_epoch = backup.agreed_epoch(folder, distribution)
    started = paths.start(config, _device_names(distribution), replicas,
                          engine=distribution.describe(), is_chief=distribution.is_chief,
                          first_epoch=first_epoch)
    plan = started.plan
    with strategy.scope():
        model = build_model(config)
        if start_weights is not None:
            model.set_weights(start_weights)
        model.compile(optimizer=keras.optimizers.SGD(
                          WarmupSchedule(plan.base_lr, plan.peak_lr, plan.warmup_steps)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], run_eagerly=config.eager,
                      steps_per_execution=config.steps_per_execution)
        model.optimizer.build(model.trainable_variables)
    if first_epoch:
        backup.restore(model, folder, first_epoch)
        # The schedule goes on from here.
        model.optimizer.iterations.assign(first_epoch * plan.steps_per_epoch)
        if distribution.is_chief:
            print(f"resuming from epoch {first_epoch}", flush=True)

    if first_epoch < config.epochs:
        train = data.train_batches(started.train_split, plan.global_batch, config.seed,
                                   first_epoch, config.epochs, config.steps_per_epoch)
        # Evaluated by EpochReport with one iterator for the run, not by fit (evaluation.py).
        test = data.eval_batches(started.test_split, plan.global_batch, config.eval_steps)
        evaluator = evaluation.Evaluator(
            model, strategy, distribute(strategy, test, replicas, config.precision),
            steps=steps_per_epoch(plan.eval_examples, plan.global_batch))
        model.fit(
            distribute(strategy, train, replicas, config.precision), epochs=config.epochs,
            initial_epoch=first_epoch, steps_per_epoch=plan.steps_per_epoch,
            shuffle=False, verbose=0,  # Shuffled already; tfdp's reporter draws the progress.
            callbacks=[EpochReport(started.reporter, evaluator, plan),
                       backup.EpochBackup(folder)])
    weights = model.get_weights()
    # Every worker logs this: equal digests show the replicas really ended identical.
    logger.info("final weights sha256 %s (worker %d)", hashlib.sha256(
        b"".join(w.tobytes() for w in weights)).hexdigest()[:16], distribution.worker_index)
    result = paths.finish(started, weights,
                          export=lambda: _export(model, distribution, config.export_root))
    if distribution.num_workers > 1:
        _barrier(strategy)  # Finish together: a chief exiting first upsets the others' heartbeat.
    # The run is complete: its backups are spent. Left in place, the same command run again
    # would "resume" after the last epoch and only export another version.
    shutil.rmtree(folder, ignore_errors=True)
    return result


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
