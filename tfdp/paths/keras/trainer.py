"""The Keras path: build and compile in the strategy scope, ``model.fit``, report, export.

``KerasFitPath`` (a ``TrainingPath``) makes the strategy (``tfdp.paths.keras.strategy``);
``train`` compiles the model and fits it with tfdp's one callback (``tfdp.paths.keras.callback``:
progress, checks between steps, and the run's ``EpochEnd``, as on every other path);
``export`` writes the chief's version. The run skeleton (``tfdp.training.lifecycle``) does the
rest.

Batches come from the same ``pipeline.train_batches`` as the manual path, and each global batch is
cut into per-replica shards exactly like ``split_batch`` (``distributed_input``), so with
equal starting weights the two paths train the same model.
"""

import hashlib
import tempfile

import keras
import numpy as np
import tensorflow as tf

from tfdp.cluster import tf_config
from tfdp.cluster.stall import PEER_LOST
from tfdp.config import model_spec
from tfdp.config.plan import steps_per_epoch
from tfdp.data import pipeline
from tfdp.export import saved_model
from tfdp.launcher import regrouping
from tfdp.models import catalog, lenet
from tfdp.models.optimizers import Optimizer
from tfdp.models.precision import input_dtype
from tfdp import paths
from tfdp.paths.keras import evaluation, workarounds
from tfdp.paths.keras.callback import FitCallback, TraceSteps, restore_state
from tfdp.paths.keras.distributed_input import distribute
from tfdp.paths.keras.strategy import make_distribution
from tfdp.paths.keras.train_step import global_batch_model
from tfdp.paths.keras.whole_step import WholeStep, keeping_survivors_step
from tfdp.trace.arrivals import Arrivals
from tfdp.training.backups import KEEP
from tfdp.training.path_contract import TrainingPath
from tfdp.util.errors import UserError
from tfdp.util.logs import logger

PRECISIONS = ("float32", "float64", "bfloat16")  # As resolved: never "auto" here.


def build_model(config, dataset, in_sync: bool, precision: str):
    """The Keras model for ``dataset`` (``tfdp.data.sources.DatasetInfo``) in ``precision``,
    trained with tfdp's step (``train_step.py``), which stamps its replicas' arrival times
    where they are ``in_sync`` under a strategy. LeNet starts from the from-scratch path's
    weights for the same ``--init`` and ``--seed``; any other model from Keras' initializers
    under ``--seed``."""
    lenet_model = config.model in model_spec.LENETS
    model = global_batch_model(
        catalog.build(config.model, dataset.image_shape, dataset.num_classes, precision,
                      config.sync_batch_norm, seed=None if lenet_model else config.seed),
        config.accumulate_steps, in_sync, config.label_smoothing)
    if lenet_model:
        model.set_weights(lenet.to_keras_weights(lenet.start_params(
            config.initializer, config.seed, batch_norm=config.model == "lenet_bn",
            input_shape=dataset.image_shape, num_classes=dataset.num_classes)))
    return model


class PlanSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The plan's learning rate of each step (``tfdp.config.plan.Plan.learning_rate``: warmup or
    one-cycle) as a Keras schedule of the optimizer's step counter."""

    def __init__(self, plan):
        self.plan = plan

    def __call__(self, step):
        return self.plan.learning_rate(step)

    def get_config(self):
        return {"schedule": self.plan.schedule, "base_lr": self.plan.base_lr,
                "peak_lr": self.plan.peak_lr, "warmup": self.plan.warmup_steps,
                "total_steps": self.plan.total_steps}


class FinalizedOnce:
    """A Keras optimizer whose averages (``use_ema``) take the weights' place when the run is
    over (``finalize``), not whenever a ``fit`` ends: a run resumed within an epoch fits twice
    (the rest of that epoch, then the epochs after it), and the second must go on from the
    live weights, as the run that was never interrupted does."""

    def finalize_variable_values(self, var_list):
        """Called by ``fit`` as it ends: nothing, the run's training may go on."""

    def finalize(self, var_list):
        super().finalize_variable_values(var_list)


def run_optimizer(config, plan):
    """``--optimizer``'s Keras optimizer (``tfdp.models.optimizers``) at the plan's rates,
    averaging under ``--ema``, its averages finalized once (``FinalizedOnce``)."""
    optimizer = Optimizer.of(config).keras(PlanSchedule(plan), use_ema=bool(config.ema),
                                           ema_momentum=config.ema or 0.99)
    optimizer.__class__ = type(f"Run{type(optimizer).__name__}",
                               (FinalizedOnce, type(optimizer)), {})
    return optimizer


class KerasFitPath(TrainingPath):
    """Keras ``fit`` under ``--strategy``'s ``tf.distribute`` strategy (``plain``: none)."""

    def __init__(self, resolved, backups):
        del backups  # The run skeleton keeps them; the run's EpochEnd saves through run.backups.
        config = self.config = resolved.config
        strategy = resolved.path.keras_strategy
        # Replicas in sync under a tf.distribute strategy meet at an exchange each step (its
        # arrivals say who is late).
        self.in_sync = strategy != paths.KERAS_DEFAULT
        self.distribution = make_distribution(strategy, config.num_gpus,
                                              config.collective_timeout)
        if self.in_sync:
            workarounds.apply()
        d = self.distribution
        self.devices = (d.devices if d.num_workers == 1 else
                        [f"/job:worker/task:{i}" for i in range(d.num_workers)])
        self.replicas, self.is_chief, self.engine = d.replicas, d.is_chief, d.describe()
        self.worker_index, self.num_workers = d.worker_index, d.num_workers
        if d.num_workers > 1:
            self.peers, self.gather_steps = tf_config.task().peers, _gather_steps(d)
            self.worker_precisions = _same_precision(d, config.precision)
        self.model = None
        self.dataset = pipeline.dataset_of(config)  # Every worker prepares it where it runs.
        # Stragglers, and the flight recorder a lost cluster's one-line error points to.
        self.recorder = Arrivals(_replica_devices(d), config.workdir) if self.in_sync else None

    def started(self) -> None:
        self.distribution.started()

    def train(self, run, state=None) -> list:
        model = self.model = self._compiled(run, state)
        if self.distribution.num_workers > 1:
            run.reporter.add_facts(worker_precisions=self.worker_precisions)
        if not run.trained:
            self._fit(run, model)
        run.tracer.finish()  # A traced range past the last step ends with the run.
        with self.distribution.strategy.scope():  # The averages in the weights' place (--ema).
            model.optimizer.finalize(model.trainable_variables)
        weights = model.get_weights()
        if self.distribution.num_workers > 1:
            # Every worker logs this: equal digests show the replicas really ended identical.
            logger.info("final weights sha256 %s (worker %d)", hashlib.sha256(
                b"".join(w.tobytes() for w in weights)).hexdigest()[:16],
                self.distribution.worker_index)
        return weights

    def _compiled(self, run, state):
        """The model built and compiled in the strategy's scope, from ``state`` where there is
        one, its optimizer's step the run's first; where the launcher re-forms a group after a
        loss, keeping which step it holds whole (``WholeStep``)."""
        config, strategy = self.config, self.distribution.strategy
        with strategy.scope():
            model = build_model(config, self.dataset, self.in_sync, config.precision)
            model.compile(optimizer=run_optimizer(config, run.plan),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"], run_eagerly=config.eager,
                          steps_per_execution=config.steps_per_execution,
                          jit_compile=config.jit_compile)
            model.optimizer.build(model.trainable_variables)
            if state is not None:  # A backup's, or a test's weights.
                restore_state(model, state)
            model.optimizer.iterations.assign(run.first_step)  # The schedule goes on from here.
            if self.distribution.num_workers > 1 and regrouping.launcher_re_forms():
                model.whole_step = WholeStep(model, strategy)
                model.whole_step.start_at(run.first_step)
        return model

    def _fit(self, run, model) -> None:
        """``fit`` the epochs left, evaluated by tfdp's callback with one iterator for the run,
        not by fit (``evaluation.py``). fit's epochs all have ``steps_per_epoch`` steps: a
        resume within an epoch first fits the rest of that epoch alone, then the epochs after
        it."""
        config, plan, strategy = self.config, run.plan, self.distribution.strategy
        dtype, replicas = input_dtype(config.precision), self.distribution.replicas

        def evaluator(split, examples):
            batches = pipeline.eval_batches(split, plan.micro_batch, config.eval_steps)
            return evaluation.Evaluator(
                model, strategy, distribute(strategy, batches, replicas, dtype),
                steps=steps_per_epoch(examples, plan.micro_batch), eval_flip=config.eval_flip,
                num_classes=self.dataset.num_classes)

        after_epochs = evaluator(run.eval_split, plan.eval_examples).evaluate

        def evaluate(final=False):  # The test set once after training: plan.tested.
            return (evaluator(run.test_split, plan.test_examples).evaluate() if final
                    else after_epochs())

        callbacks = [FitCallback(run, self.distribution, evaluate, self.recorder)]
        if run.tracer.on:
            callbacks.append(TraceSteps(run.tracer, run.first_step))
        first_epoch, offset = run.first_epoch, run.offset
        parts = ([(first_epoch, first_epoch + 1, offset)] if offset else []) + [
            (first_epoch + (1 if offset else 0), config.epochs, 0)]
        with run.watch.training(run.first_step), \
                keeping_survivors_step(model, run, self.worker_index):
            for begin, end, skip in parts:
                if begin >= end or run.reached:  # Reached: --target_accuracy.
                    continue
                train = pipeline.train_batches(run.train_split, plan.global_batch, config.seed,
                                               begin, end, plan.steps_per_epoch,
                                               config.augment == "flip").skip(skip)
                model.fit(distribute(strategy, train, replicas, dtype),
                          epochs=end, initial_epoch=begin,
                          steps_per_epoch=plan.steps_per_epoch - skip, shuffle=False,
                          verbose=0,  # Shuffled already; tfdp's reporter draws progress.
                          callbacks=callbacks)

    def serving_model(self, precision: str):
        """The trained model; in another precision, its layers and weights computing in it."""
        if precision == self.config.precision:
            return self.model
        twin = build_model(self.config, self.dataset, self.in_sync, precision)
        twin.set_weights(self.model.get_weights())
        return twin

    def export(self, config):
        """The chief writes the next version; the others save to a scratch folder they delete,
        because saving distributed variables is a collective every worker must join. Then all
        finish together: a chief exiting first upsets the others' heartbeat."""
        d = self.distribution
        if d.is_chief:
            path = super().export(config)
        else:
            scratch = tempfile.mkdtemp(prefix=f"tfdp-worker{d.worker_index}-")
            saved_model.save_scratch(self.model, scratch, self.config.eval_flip,
                                     self.dataset.class_names)
            path = None
        if d.num_workers > 1:
            try:
                _barrier_step(d.strategy)
            except PEER_LOST:  # This worker's part is saved (the chief's: the version).
                logger.info("a peer was lost at the export's end, after this worker's part")
        return path


def _replica_devices(distribution) -> list:
    """A name per replica, in the order of their ids: across workers, worker-major."""
    if distribution.num_workers == 1:
        return list(distribution.devices)
    local = distribution.replicas // distribution.num_workers
    return [f"/job:worker/task:{w}/device:{d}" for w in range(distribution.num_workers)
            for d in range(local)]


def _gather_rows(distribution, width: int):
    """``gather(row) -> [row of every worker]`` for rows of ``width`` integers: one all-reduce,
    each worker filling its own row."""
    strategy = distribution.strategy

    @tf.function  # Collectives run eagerly are slow and warn about it.
    def all_rows(rows):
        return strategy.reduce("SUM", strategy.run(lambda r: r, args=(rows,)), axis=None)

    def gather(row):
        rows = np.zeros([distribution.num_workers, width], np.int64)
        rows[distribution.worker_index, :len(row)] = row
        # Every local replica adds the rows once.
        return all_rows(tf.constant(rows)).numpy() // len(distribution.devices)

    return gather


def _gather_steps(distribution, slots: int = KEEP + 1):
    """``gather(steps) -> [steps of every worker]``."""
    gather_rows = _gather_rows(distribution, slots)

    def gather(steps):
        mine = np.asarray(steps[:slots], np.int64) + 1  # 0 stands for "no backup".
        return [[int(s) - 1 for s in row if s > 0] for row in gather_rows(mine)]

    return gather


def _same_precision(distribution, precision: str) -> list:
    """Every worker's precision, refused in one line unless all are the same: the replicas of
    one synchronous model must compute alike, and ``--precision=auto`` is decided by each
    worker's own machine (``tfdp.models.precision.resolve``)."""
    every = [PRECISIONS[int(row[0])] for row in
             _gather_rows(distribution, 1)([PRECISIONS.index(precision)])]
    if len(set(every)) > 1:
        raise UserError("the workers would compute in different precisions ("
                        + ", ".join(f"worker {i}: {p}" for i, p in enumerate(every))
                        + "; --precision=auto decides by each worker's machine): give every "
                        "worker the same --precision")
    return every


@tf.function
def _barrier_step(strategy):
    return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1)), axis=None)
