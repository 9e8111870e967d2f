"""The parameter-server path: workers compute gradients, servers hold the parameters.

Section 12.7.3-12.7.4 of the textbook, on TensorFlow's engine (``ParameterServerStrategy`` and
a ``ClusterCoordinator``; Keras 3 ``fit`` does not run under it, keras-team/keras#18624, so the
loop is ours, as in TensorFlow's tutorial "Parameter server training with
ParameterServerStrategy"). The cluster comes from ``TF_CONFIG``: this process is the ``chief``
(the coordinator); ``worker`` and ``ps`` tasks run ``python -m tfdp.server``.

1. The model's variables are made under the strategy, so they live on the servers
   (``tfdp.paths.parameter_server.store``): the from-scratch LeNet's parameters, or a Keras
   ResNet-18's (Keras 3 layers read and update variables the strategy placed, batch-norm
   statistics included). The log says which server holds what.
2. The data, as on a real cluster: every worker reads the arrays from its own disk
   (``create_per_worker_dataset``; ``tfdp.server`` prepared them). An epoch is the same global
   batches, in the same order, as on every other path; the coordinator sends each batch's
   example indices (one int32 per example) with the step that trains on it.
3. A step, scheduled on whichever worker is free: read the update counter, pull the
   parameters, compute the gradient of the batch, push ``param -= lr * grad`` to the servers,
   bump the counter. Asynchronous SGD: other workers' updates land in between. The staleness
   of a step is how many updates landed between its pull and its push.
4. The shared epoch loop (``tfdp.training.loop``) keeps up to two steps in flight per worker;
   after every epoch: evaluation (scheduled on the workers too), the report with the epoch's
   staleness, and a backup of the parameters written by the chief; the same command resumes
   from it.

Faults: a worker's death never ends the run. The coordinator retries a failed worker's step on
another, and a worker that comes back (the launcher restarts it) rejoins; but when the failure
reaches the chief itself (a step's result, an evaluation), the coordinator cancels every step
in flight and raises. ``ScheduledSteps`` then schedules again the steps whose results were lost
and evaluates again. A step runs at least once, and its update lands once: beside each variable
its server keeps the numbers of the steps that pushed to it (``step.once``), so a step run again
after its worker pushed some or all of its update pushes only what did not land, and the
update counter counts it once (``updates_applied`` in metrics.json). A failure is a worker's
by TensorFlow's own rule (``_is_worker_failure``); a parameter server that fails ends the run
in one line naming it.
"""

import os

import numpy as np
import tensorflow as tf
# Private: "a worker's failure", and a step's lost input (TensorFlow's minor version is pinned).
from tensorflow.python.distribute.coordinator.cluster_coordinator import (
    ClosureAbortedError, ClosureInputError, _is_worker_failure)

from tfdp.cluster import tf_config
from tfdp.cluster.stall import STARTING, Stall, watching
from tfdp.data import pipeline, sources
from tfdp import paths
from tfdp.paths.parameter_server.pace import WorkerPace
from tfdp.paths.parameter_server.step import make_eval_step, make_train_step
from tfdp.paths.parameter_server.store import MIN_SHARD_BYTES, Store, make_store
from tfdp.training import loop
from tfdp.training.path_contract import TrainingPath
from tfdp.training.state import TrainingState
from tfdp.util.errors import UserError
from tfdp.util.logs import logger

READING = "reading the parameters from the servers"
JOBS = ("worker", "ps")
_CLUSTER_ERRORS = (tf.errors.OpError, ClosureInputError, ClosureAbortedError)  # Step failures.


def task_of(config) -> tf_config.Task:
    """This process's task: the chief of a cluster with workers and parameter servers."""
    if not os.environ.get(tf_config.ENV):
        raise UserError(f"--strategy=parameter_server needs a cluster: {tf_config.ENV} with a "
                        "chief (this process), workers and ps tasks; python -m tfdp.launch "
                        "--num_workers=2 --num_ps=1 -- --strategy=parameter_server starts one here")
    task = tf_config.client_task(paths.get("parameter_server").program, JOBS,
                                 "--strategy=parameter_server needs workers and parameter "
                                 "servers (ps)",
                                 wait=config.collective_timeout)
    servers = len(task.cluster["ps"])
    if config.ps_shards > servers:
        raise UserError(f"--ps_shards={config.ps_shards} is more than the {servers} parameter "
                        f"server(s) of {tf_config.ENV}: a shard per server at most")
    return task


class ParameterServerPath(TrainingPath):
    """The coordinator of a cluster of workers and parameter servers (``TF_CONFIG``)."""

    def __init__(self, resolved, backups):
        config = self.config = resolved.config
        task = task_of(config)
        self.peers = self.servers_traced = tf_config.job_peers(task, JOBS)
        self.servers = len(task.cluster["ps"])
        self.stall = Stall(config.collective_timeout, self.peers, backups.steps)
        # Stragglers, and the flight recorder a lost cluster's one-line error points to.
        self.recorder = self.stall.recorder = WorkerPace(len(task.cluster["worker"]),
                                                         config.workdir)
        with self.stall.watching(STARTING):
            self.strategy, self.coordinator = _connect(config)
        with self.stall.watching("loading the data on the workers"):
            self.dataset = pipeline.dataset_on("/job:worker/replica:0/task:0/device:CPU:0",
                                           f"worker 0 ({task.cluster['worker'][0]})", config)
            folder = self.dataset.folder
            self.arrays = {use: self.coordinator.create_per_worker_dataset(
                _arrays_fn(folder, split, self.dataset.image_shape))
                for use, split in self.dataset.uses.items()}
            self.sizes = _examples(self.coordinator, self.arrays)
            self.examples = self.sizes["train"], self.sizes["eval"]
        num_workers = len(task.cluster["worker"])
        logger.info("data: %s examples, read by each of the %d workers from its own %s",
                    sources.counted({split: self.sizes[use]
                                     for use, split in self.dataset.uses.items()}),
                    num_workers, folder)
        self.devices = [f"/job:worker/replica:0/task:{i}" for i in range(num_workers)]
        self.replicas = 1
        self.engine = (f"{num_workers} worker(s) and {self.servers} parameter server(s), "
                       "asynchronous SGD, one global batch per step on one worker")
        self.store = self.weights = None

    def train(self, run, state=None) -> list:
        # Asynchronous SGD keeps no slots (its checks): the state is the weights, and the
        # model's seed states.
        self.store = make_store(self.config, self.strategy, self.servers, self.dataset, state)
        logger.info("parameters: %s", self.store.describe())
        # In metrics.json: what each server holds (the host benchmark's arithmetic needs it).
        run.reporter.add_facts(parameter_server_bytes=self.store.bytes_per_server(self.servers))
        steps = ScheduledSteps(run, self.coordinator, self.recorder, self.store, self.arrays,
                               self.sizes)
        loop.train(run, steps)
        self.weights = steps.state().weights
        # One per step this run trained, however often a step ran (``step.once``).
        run.reporter.add_facts(updates_applied=int(self.store.updates.numpy()))
        return self.weights

    def serving_model(self, precision: str):
        return self.store.serving_model(self.weights, precision)


def _connect(config):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    partitioner = (tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=MIN_SHARD_BYTES, max_shards=config.ps_shards)
        if config.ps_shards > 1 else None)
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=partitioner)
    return strategy, tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)


def _arrays_fn(folder: str, split: str, image_shape: tuple):
    """A worker's ``split``, read from its own disk where the dataset is made: one element,
    (all images, all labels), repeated, from which each step gathers its batch."""
    return lambda: tf.data.Dataset.from_tensors(
        pipeline.read_arrays(folder, split, image_shape)).repeat()


def _examples(coordinator, arrays) -> dict:
    """{use: size} of ``arrays`` ({use: per-worker dataset}), as a worker holds them."""
    @tf.function
    def size(iterator):
        return tf.shape(next(iterator)[1])[0]

    found = {use: coordinator.schedule(size, args=(iter(dataset),))
             for use, dataset in arrays.items()}
    return {use: int(value.fetch()) for use, value in found.items()}


class _Step:
    """A step on the cluster: what it trains on, and its result once collected."""

    def __init__(self, number, batch, lr):
        self.number, self.batch, self.lr = number, batch, lr  # number: the global step.
        self.remote = self.result = None


class ScheduledSteps(loop.Steps):
    """The loop's steps scheduled on whichever worker is free, at most two in flight per
    worker; the staleness of each step goes into its epoch's record."""

    def __init__(self, run, coordinator, pace: WorkerPace, store: Store, arrays, examples):
        self.run, self.coordinator, self.store, self.examples = run, coordinator, store, examples
        self.pace, self.window = pace, 2 * len(pace.names)
        self.train_step = make_train_step(store, run.config)
        self.eval_step = make_eval_step(store, run.config.eval_flip)
        # {use: iterator}: "train", "eval" (after every epoch), "test" (once after training).
        self.arrays = {use: iter(dataset) for use, dataset in arrays.items()}
        self.staleness, self.in_flight = [], []  # in_flight: issued, not yet collected.

    def batches(self, first_epoch, offset):
        config, plan = self.run.config, self.run.plan
        return pipeline.index_batches(self.examples["train"], plan.global_batch, config.seed,
                                  first_epoch, offset, config.epochs, plan.steps_per_epoch,
                                  config.augment == "flip")

    def issue(self, batches, first_step, count):  # count is 1: --sync_every is manual's.
        step = _Step(first_step + 1, next(batches)[0],
                     tf.constant(self.run.plan.learning_rate(first_step)))
        self._schedule(step)
        self.in_flight.append(step)
        return step

    def _schedule(self, step: _Step) -> None:
        step.remote = self._surviving(lambda: self.coordinator.schedule(
            self.train_step, args=(self.arrays["train"], step.batch, step.lr,
                                   tf.constant(step.number, tf.int64))))

    def collect(self, step):
        while step.result is None:
            try:
                step.result = step.remote.fetch()
            except _CLUSTER_ERRORS as e:
                self._worker_lost(e)
        self.in_flight.remove(step)
        loss, correct, stale, worker, times = (np.asarray(v) for v in step.result)
        self.staleness.append(int(stale))
        self.pace.add(step.number, int(worker), *times.tolist())
        return [(float(loss), int(correct), int(step.batch.shape[0]))]

    def _worker_lost(self, error) -> None:
        """A worker's failure reached the chief: once the coordinator has cancelled every step
        in flight, keep the results that came and schedule the others again."""
        _raise_unless_a_worker_failed(error)
        logger.warning("a worker was lost (%s): scheduling its steps again on the workers "
                       "left", _first_line(error))
        self._surviving(self.coordinator.done)  # Raises the failure, cancelling what is queued.
        for step in self.in_flight:
            if step.result is None:
                try:
                    step.result = step.remote.fetch()  # Finished, or cancelled: no waiting.
                except _CLUSTER_ERRORS as e:
                    _raise_unless_a_worker_failed(e)
                    self._schedule(step)

    def _surviving(self, call):
        """``call()``, once more after each worker failure it raises (the coordinator raises
        a failure once, then carries on)."""
        while True:
            try:
                return call()
            except _CLUSTER_ERRORS as e:
                _raise_unless_a_worker_failed(e)

    def evaluate(self, final=False):
        use = "test" if final else "eval"  # The test set once after training (plan.tested).
        plan = self.run.plan
        while True:
            results = [self._surviving(lambda i=indices: self.coordinator.schedule(
                self.eval_step, args=(self.arrays[use], i)))
                for indices in pipeline.eval_indices(self.examples[use], plan.micro_batch,
                                                     plan.eval_steps)]
            try:
                sums = [value.fetch() for value in results]
            except _CLUSTER_ERRORS as e:
                _raise_unless_a_worker_failed(e)
                logger.warning("a worker was lost while evaluating (%s): evaluating again",
                               _first_line(e))
                self._surviving(self.coordinator.done)
                continue
            return loop.mean_over(sums, plan.test_examples if final else plan.eval_examples)

    def state(self) -> TrainingState:
        with watching(self.run.stall, READING):
            return TrainingState(self.store.weights(), states=self.store.states())

    def epoch_figures(self):
        mean, most = float(np.mean(self.staleness)), int(np.max(self.staleness))
        self.staleness = []
        figures, note = self.pace.epoch_figures()
        return ({"staleness_mean": mean, "staleness_max": most, **figures},
                f", staleness mean {mean:.2f} max {most}{note}")


def _raise_unless_a_worker_failed(error) -> None:
    """Re-raise ``error`` unless it is one worker's failure, or a step cancelled because of
    one: anything else (a parameter server lost, a bug) ends the run."""
    if not (_is_worker_failure(error) or isinstance(error, tf.errors.CancelledError)):
        raise error


def _first_line(error) -> str:
    text = str(getattr(error, "message", error)).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:160] if text else ''}"
