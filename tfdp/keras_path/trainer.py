"""The Keras path: build and compile in the strategy scope, ``model.fit``, report, export.

Batches come from the same ``data.train_batches`` as the manual path, and each global batch is
cut into per-replica shards exactly like ``split_batch`` (``data.per_replica_batches``), so with
equal starting weights the two paths train the same model.
"""

import hashlib
import shutil
import tempfile
import time

import keras
import tensorflow as tf

from tfdp import data, export, report, schedule
from tfdp.keras_path import backup, evaluation, keras_mwms_fix, mwms_input
from tfdp.keras_path.strategy import make_distribution
from tfdp.keras_path.train_step import global_batch_model
from tfdp.logs import logger
from tfdp.models import lenet, resnet


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
    """The shared ``Reporter``'s progress bar and epoch line, as on the manual path: times each
    epoch's training, then evaluates. (fit runs with ``verbose=0``: Keras' own bar would print
    its line around tfdp's and under other metric names.)"""

    def __init__(self, reporter, evaluator, steps, batch_size, num_examples):
        super().__init__()
        self.reporter, self.evaluator, self.steps = reporter, evaluator, steps
        self.examples = min(steps * batch_size, num_examples)

    def on_epoch_begin(self, epoch, logs=None):
        self._progress = self.reporter.progress(epoch, self.steps)
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if not self._progress.verbose:  # Reading the logs would wait for the step: skip.
            return
        self._progress.update(batch + 1, [("loss", float(logs["loss"])),
                                          ("train_acc", float(logs["accuracy"]))])

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._start  # Training only: evaluation comes next.
        test_loss, test_acc = self.evaluator.evaluate()
        self.reporter.epoch_end(epoch, loss=logs["loss"], train_acc=logs["accuracy"],
                                test_loss=test_loss, test_acc=test_acc, seconds=seconds,
                                examples=self.examples)


def run(config, start_weights=None) -> dict:
    """Train ``config.model`` with Keras fit under ``config.strategy``; export from the chief.

    ``start_weights`` (Keras weights) override ``config.initializer``: tests compare paths."""
    distribution = make_distribution(config.strategy, config.num_gpus, config.collective_timeout)
    if config.strategy != "plain":
        keras_mwms_fix.apply()
    strategy, replicas = distribution.strategy, distribution.replicas
    if distribution.is_chief:
        export.check_export_root(config.export_root)
    batch = config.global_batch_size(replicas)
    train_split, test_split = data.load_splits(config.data_dir, config.manual_dir,
                                               config.synthetic_data)
    steps = data.steps_per_epoch(len(train_split.labels), batch, config.steps_per_epoch)
    warmup = schedule.warmup_steps(config.warmup_epochs, steps) if config.scale_lr else 0
    peak_lr = config.peak_lr(replicas)
    logger.info("%s: %s; global batch %d = %s per replica; lr %g%s; %s", config.strategy,
                distribution.describe(), batch,
                " + ".join(map(str, data.shard_sizes(batch, replicas))),
                peak_lr, f" after {warmup} warmup steps from {config.lr:g}" if warmup else "",
                config.precision)

    folder = backup.worker_folder(config.run_dir, distribution.worker_index)
    first_epoch = backup.agreed_epoch(folder, distribution)
    with strategy.scope():
        model = build_model(config)
        if start_weights is not None:
            model.set_weights(start_weights)
        model.compile(optimizer=keras.optimizers.SGD(WarmupSchedule(config.lr, peak_lr, warmup)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], run_eagerly=config.eager,
                      steps_per_execution=config.steps_per_execution)
        model.optimizer.build(model.trainable_variables)
    if first_epoch:
        backup.restore(model, folder, first_epoch)
        model.optimizer.iterations.assign(first_epoch * steps)  # The schedule goes on from here.
        if distribution.is_chief:
            print(f"resuming from epoch {first_epoch}", flush=True)

    eval_examples = data.eval_examples(len(test_split.labels), batch, config.eval_steps)
    reporter = report.Reporter(
        config.run_dir, report.run_facts(config, batch, replicas), _device_names(distribution),
        distribution.is_chief,
        history=report.load_history(config.run_dir, first_epoch) if distribution.is_chief else (),
        eval_examples=eval_examples, test_examples=len(test_split.labels))
    if first_epoch < config.epochs:
        train = data.train_batches(train_split, batch, config.seed, first_epoch, config.epochs,
                                   config.steps_per_epoch)
        # Evaluated by EpochReport with one iterator for the run, not by fit (evaluation.py).
        test = data.eval_batches(test_split, batch, config.eval_steps)
        evaluator = evaluation.Evaluator(model, strategy,
                                         _distribute(strategy, test, replicas, config.precision),
                                         steps=data.steps_per_epoch(eval_examples, batch))
        model.fit(
            _distribute(strategy, train, replicas, config.precision), epochs=config.epochs,
            initial_epoch=first_epoch, steps_per_epoch=steps, shuffle=False,  # Already shuffled.
            verbose=0,
            callbacks=[EpochReport(reporter, evaluator, steps, batch, len(train_split.labels)),
                       backup.EpochBackup(folder)])
    line = reporter.final_line()
    weights = model.get_weights()
    # Every worker logs this: equal digests show the replicas really ended identical.
    logger.info("final weights sha256 %s (worker %d)", hashlib.sha256(
        b"".join(w.tobytes() for w in weights)).hexdigest()[:16], distribution.worker_index)
    path = _export(model, distribution, config.export_root)
    reporter.record_export(path)
    if distribution.num_workers > 1:
        _barrier(strategy)  # Finish together: a chief exiting first upsets the others' heartbeat.
    # The run is complete: its backups are spent. Left in place, the same command run again
    # would "resume" after the last epoch and only export another version.
    shutil.rmtree(folder, ignore_errors=True)
    return {"final_line": line, "export_path": path, "records": reporter.records,
            "weights": weights}


def _distribute(strategy, global_batches, replicas, dtype="float32"):
    """Per-replica ``(images, labels, example_weights)``, cut like the manual path's
    ``split_batch``; images and weights in ``dtype``.

    Under MirroredStrategy each replica gets an iterator of its own (PER_REPLICA). The default,
    one MultiDeviceIterator per worker, costs about 27 ms a step here: mirrored on 2 devices,
    60-step epochs, trained 3,070-3,170 examples/s with it and 4,430-4,760 without. Under
    MultiWorkerMirroredStrategy, which refuses PER_REPLICA, ``mwms_input`` does the same.

    Every input is repeated: callers take exactly the batches they need (fit stops at
    ``steps_per_epoch`` x ``epochs``, the evaluator at its ``steps``), and an input that never
    ends spares tf.distribute an all-reduce every step to check that every replica still has
    data (``_enable_get_next_as_optional`` in tf.distribute's input_lib): under
    MultiWorkerMirroredStrategy one more cross-process collective per step.
    """
    def to_model_input(images, labels, weights):
        return data.to_float(images, dtype), labels, tf.cast(weights, dtype)

    if strategy is tf.distribute.get_strategy():  # --strategy=plain: Keras' default strategy.
        return data.per_replica_batches(global_batches, 1, 0, 1).map(to_model_input).repeat()

    def dataset_fn(context):
        # Cut first, then convert: each pipeline turns only its own shards into floats.
        return data.per_replica_batches(
            global_batches, replicas,
            first=context.input_pipeline_id * (replicas // context.num_input_pipelines),
            count=replicas // context.num_input_pipelines
        ).map(to_model_input).repeat()

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return mwms_input.distribute(strategy, dataset_fn)
    return strategy.distribute_datasets_from_function(dataset_fn, tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA))


def _export(model, distribution, export_root):
    """The chief writes the next version; the others save to a scratch folder they delete,
    because saving distributed variables is a collective every worker must join."""
    if distribution.is_chief:
        path = export.export(model, export_root)
        print(f"exported {path}", flush=True)
        return path
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
