"""The parameter-server path: workers compute gradients, servers hold the parameters.

Section 12.7.3-12.7.4 of the textbook, on TensorFlow's engine (``ParameterServerStrategy`` and
a ``ClusterCoordinator``; Keras 3 ``fit`` does not run under it, keras-team/keras#18624, so the
loop is ours, as in TensorFlow's tutorial "Parameter server training with
ParameterServerStrategy"). The cluster comes from ``TF_CONFIG``: this process is the ``chief``
(the coordinator); ``worker`` and ``ps`` tasks run ``python -m tfdp.server``.

1. The model's variables are made under the strategy, so they live on the servers (round
   robin): the from-scratch LeNet's parameters (``LenetStore``; ``--ps_shards=n`` splits each
   large one into up to n shards, ``MinSizePartitioner``, each on its own server), or a Keras
   ResNet-18's (``KerasStore``: Keras 3 layers read and update variables the strategy placed,
   batch-norm statistics included). The log says which server holds what.
2. The data, as on a real cluster: every worker reads the arrays from its own disk
   (``create_per_worker_dataset``; ``tfdp.server`` prepared them). An epoch is the same global
   batches, in the same order, as on every other path; the coordinator sends each batch's
   example indices (one int32 per example) with the step that trains on it.
3. A step, scheduled on whichever worker is free: read the update counter, pull the
   parameters, compute the gradient of the batch, push ``param -= lr * grad`` to the servers,
   bump the counter. Asynchronous SGD: other workers' updates land in between. The staleness
   of a step is how many updates landed between its pull and its push.
4. After every epoch: evaluation (scheduled on the workers too), the report, and a backup of
   the parameters written by the chief; the same command resumes from it.

Faults: the coordinator retries a step whose worker failed on another worker, and a worker
that comes back (the launcher restarts it) rejoins. A parameter server that fails ends the run
in one line naming it.
"""

import collections
import contextlib
import os
import time

import numpy as np
import tensorflow as tf

from tfdp import cluster, data, schedule
from tfdp.errors import Diverged, Preempted, UserError
from tfdp.logs import logger
from tfdp.manual.remote import PEER_LOST, STARTING, Stall
from tfdp.manual.trainer import count_correct, lenet_logits
from tfdp.manual.trainer import serving_model as lenet_serving_model
from tfdp.models import lenet, resnet
from tfdp.models.precision import input_dtype

PROGRAM = ("tfdp.train --strategy=parameter_server (the coordinator; its workers and "
           "parameter servers run python -m tfdp.server)")
# A parameter smaller than this stays whole under --ps_shards: only W2 and W3 of LeNet are
# worth splitting (100 KB and 410 KB; the rest are 5 KB or less).
MIN_SHARD_BYTES = 32 << 10
READING = "reading the parameters from the servers"


def task_of(config) -> cluster.Task:
    """This process's task: the chief of a cluster with workers and parameter servers."""
    if not os.environ.get(cluster.ENV):
        raise UserError(f"--strategy=parameter_server needs a cluster: {cluster.ENV} with a "
                        "chief (this process), workers and ps tasks; python -m tfdp.launch "
                        "--num_workers=2 --num_ps=1 -- --strategy=parameter_server starts one here")
    task = cluster.task(kinds=("chief",), program=PROGRAM)
    for job in ("worker", "ps"):
        if not task.cluster.get(job):
            raise UserError(f"{cluster.ENV} names no {job} tasks: --strategy=parameter_server "
                            "needs workers and parameter servers (ps)")
    servers = len(task.cluster["ps"])
    if config.ps_shards > servers:
        raise UserError(f"--ps_shards={config.ps_shards} is more than the {servers} parameter "
                        f"server(s) of {cluster.ENV}: a shard per server at most")
    return task


def peers_of(task: cluster.Task) -> list:
    return ([(f"worker {i}", a) for i, a in enumerate(task.cluster["worker"])]
            + [(f"ps {i}", a) for i, a in enumerate(task.cluster["ps"])])


def run(config, start_weights=None):
    """Connect, place the parameters, train asynchronously, report, export (``tfdp.paths``)."""
    from tfdp import checkpoints, export, paths, preemption

    task = task_of(config)
    peers = peers_of(task)
    with preemption.Watch() as watch:
        backups = checkpoints.Backups(config.run_dir, 0, config.identity)
        stall = Stall(config.collective_timeout, peers, backups.steps)
        cluster.check_port_free(task)
        with stall.watching(STARTING):
            strategy, coordinator = _connect(config)
        folder = data.prepared_dir(config.data_dir)
        with stall.watching("loading the data on the workers"):
            arrays = {split: coordinator.create_per_worker_dataset(_arrays_fn(folder, split))
                      for split in ("train", "test")}
            examples = _examples(coordinator, arrays)
        logger.info("data: %d training and %d test examples, read by each of the %d workers from "
                    "its own %s", *examples, len(task.cluster["worker"]), folder)
        workers = [f"/job:worker/replica:0/task:{i}" for i in range(len(task.cluster["worker"]))]
        first_step = checkpoints.resume_step(backups)
        started = paths.start(config, workers, 1, engine=(
            f"{len(workers)} worker(s) and {len(task.cluster['ps'])} parameter server(s), "
            "asynchronous SGD, one global batch per step on one worker"), first_step=first_step,
            examples=examples)
        weights = backups.load(first_step) if first_step else start_weights
        store = make_store(config, strategy, len(task.cluster["ps"]), weights)
        logger.info("parameters: %s", store.describe())
        # In metrics.json: what each server holds (the host benchmark's arithmetic needs it).
        started.reporter.facts["parameter_server_bytes"] = store.bytes_per_server(
            len(task.cluster["ps"]))
        try:
            train(config, started, coordinator, len(workers), store, arrays, examples,
                  first_step, backups, watch, stall)
            with stall.watching(READING):
                trained = store.weights()
        except PEER_LOST as e:
            raise UserError(cluster.lost_contact(type(e).__name__, peers, str(e.message),
                                                 backups.steps())) from None
        result = paths.finish(started, trained, export=lambda: export.export(
            store.serving_model(trained, config.precision), config.export_root),
            backups=backups)
    backups.clear()
    return result


def _connect(config):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    partitioner = (tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=MIN_SHARD_BYTES, max_shards=config.ps_shards)
        if config.ps_shards > 1 else None)
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=partitioner)
    return strategy, tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)


def _arrays_fn(folder: str, split: str):
    """A worker's ``split``, read from its own disk where the dataset is made: one element,
    (all images, all labels), repeated, from which each step gathers its batch."""
    images_path, labels_path = data.array_paths(folder, split)

    def dataset_fn():
        images = data.read_npy(images_path, tf.uint8, data.IMAGE_SHAPE)
        labels = data.read_npy(labels_path, tf.int64, ())
        return tf.data.Dataset.from_tensors((images, labels)).repeat()

    return dataset_fn


def _examples(coordinator, arrays) -> tuple:
    """(train, test) sizes, as a worker holds them."""
    @tf.function
    def size(iterator):
        return tf.shape(next(iterator)[1])[0]

    found = [coordinator.schedule(size, args=(iter(arrays[split]),)) for split in ("train", "test")]
    return tuple(int(value.fetch()) for value in found)


def make_store(config, strategy, servers: int, weights=None):
    """The model's variables on the ``servers``, from Keras-order ``weights`` (a backup's, or
    a test's start) or the model's own start. Without ``--ps_shards``, spread by size
    (``balanced``); with it, the strategy's partitioner shards and places them."""
    if config.model == "resnet18":
        def build():
            return resnet.resnet(precision=config.precision)

        sizes = _creation_sizes(build)
    else:
        params = (lenet.from_keras_weights(weights) if weights is not None else
                  lenet.start_params(config.initializer, config.seed,
                                     np.dtype(config.variable_dtype)))
        sizes = [value.nbytes for value in params.values()]
    with strategy.scope():
        # Updates applied so far, on a server too: a step reads it before it pulls and bumps it
        # after it pushes, and the difference is the step's staleness.
        updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
        placing = (balanced(servers, sizes) if config.ps_shards == 1 else
                   contextlib.nullcontext())
        if config.model == "resnet18":
            with placing:
                model = build()
            if weights is not None:
                model.set_weights(weights)
            return KerasStore(model, config.precision, updates)
        with placing:
            return LenetStore(params, config.precision, updates)


def _creation_sizes(build) -> list:
    """The byte sizes of the variables ``build()`` makes, in the order it makes them (a dry
    run, here: a Keras model lists its variables in another order)."""
    sizes = []

    def record(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        sizes.append(_nbytes(variable))
        return variable

    with tf.variable_creator_scope(record):
        build()
    return sizes


def _nbytes(variable) -> int:
    return int(np.prod(variable.shape)) * tf.as_dtype(variable.dtype).size


@contextlib.contextmanager
def balanced(servers: int, sizes: list):
    """Place the variables created inside, whose byte sizes in creation order are ``sizes``,
    largest first on the server holding the fewest bytes so far (TensorFlow 1's
    ``GreedyLoadBalancingStrategy``). The strategy's own round robin puts every one of LeNet's
    weight matrices, or every ResNet kernel, on server 0 and every bias on server 1."""
    load, plan = [0] * servers, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        plan[i] = load.index(min(load))
        load[plan[i]] += sizes[i]
    # The strategy places a variable only with another (colocation): one small anchor on each
    # server, made by its round robin.
    anchors = {}
    while len(anchors) < servers:
        anchor = tf.Variable(0, dtype=tf.int8, trainable=False, name="placement_anchor")
        anchors.setdefault(tf.DeviceSpec.from_string(anchor.device).task, anchor)
    created = []

    def creator(next_creator, **kwargs):
        index = len(created)
        if index >= len(plan):
            raise RuntimeError(f"variable {index + 1} was not planned ({len(plan)} were)")
        variable = next_creator(colocate_with=anchors[plan[index]], **kwargs)
        if _nbytes(variable) != sizes[index]:
            raise RuntimeError(f"variable {index + 1} ({variable.name}) is not the one planned "
                               f"({_nbytes(variable)} bytes, not {sizes[index]})")
        created.append(variable)
        return variable

    with tf.variable_creator_scope(creator):
        yield


class Store:
    """The variables on the servers: the textbook's (key, value) store. A step pulls by reading
    them and pushes ``v -= lr * grad`` to each (``trainable``). Subclasses say what the model
    is: ``logits``, ``weights`` (read on the coordinator, Keras order), ``serving_model``,
    ``held``."""

    def __init__(self, precision: str, updates: tf.Variable):
        self.compute = tf.as_dtype(precision)
        self.updates = updates  # The update counter (``make_store``).

    def bytes_per_server(self, servers: int) -> list:
        held = self.held()
        return [sum(b for _, b in held.get(i, [])) for i in range(servers)]

    def describe(self) -> str:
        return "; ".join(f"ps {server} holds "
                         f"{', '.join(f'{n} ({b / 1e3:.1f} KB)' for n, b in items[:12])}"
                         + (f" and {len(items) - 12} more" if len(items) > 12 else "")
                         + f" = {sum(b for _, b in items) / 1e3:.1f} KB"
                         for server, items in sorted(self.held().items()))


def _held_by(variables) -> dict:
    """Server index -> [(name, bytes)] of ``variables`` (name, variable) pairs."""
    held = collections.defaultdict(list)
    for name, variable in variables:
        server = tf.DeviceSpec.from_string(variable.device).task
        held[server].append((name, int(np.prod(variable.shape)) * variable.dtype.size))
    return held


class LenetStore(Store):
    """The from-scratch LeNet's parameters, each whole or in shards (``--ps_shards``)."""

    def __init__(self, params: dict, precision: str, updates: tf.Variable):
        super().__init__(precision, updates)
        self.variables = {name: tf.Variable(value, name=name) for name, value in params.items()}
        self.shards = {name: list(getattr(v, "variables", [v]))
                       for name, v in self.variables.items()}
        self.trainable = [p for parts in self.shards.values() for p in parts]

    def logits(self, images, training: bool):
        """Every parameter whole (shards concatenated), read from the servers, then LeNet."""
        del training
        params = {name: parts[0].read_value() if len(parts) == 1 else
                  tf.concat([p.read_value() for p in parts], axis=0)
                  for name, parts in self.shards.items()}
        return lenet_logits(params, images, self.compute)

    def weights(self) -> list:
        return lenet.to_keras_weights({name: np.concatenate([p.numpy() for p in parts], axis=0)
                                       for name, parts in self.shards.items()})

    def serving_model(self, weights, precision):
        return lenet_serving_model(lenet.from_keras_weights(weights), precision)

    def held(self) -> dict:
        return _held_by((name if len(parts) == 1 else f"{name}[{i + 1}/{len(parts)}]", part)
                        for name, parts in self.shards.items()
                        for i, part in enumerate(parts))


class KerasStore(Store):
    """A Keras model's variables (ResNet-18): its layers read them, and batch normalization
    updates its statistics, on the servers."""

    def __init__(self, model, precision: str, updates: tf.Variable):
        super().__init__(precision, updates)
        self.model = model
        # The TensorFlow variables under Keras' own: their assign_sub runs on the server, in
        # one step (Keras' assign_sub reads, subtracts and writes back the whole value from the
        # worker, losing the updates other workers make in between).
        self.trainable = [v.value for v in model.trainable_variables]
        self.input_dtype = input_dtype(precision)

    def logits(self, images, training: bool):
        logits = self.model(data.to_float(images, self.input_dtype), training=training)
        return tf.cast(logits, tf.float32)

    def weights(self) -> list:
        return self.model.get_weights()

    def serving_model(self, weights, precision):
        """The same model made here, off the servers, holding the trained weights."""
        model = resnet.resnet(precision=precision)
        model.set_weights(weights)
        return model

    def held(self) -> dict:
        return _held_by((v.path, v.value) for v in self.model.variables)


def make_train_step(store: Store):
    """``step(arrays, indices, lr) -> (loss, correct, staleness)`` on one worker: pull, compute
    the batch's gradient, push the update."""
    variables = store.trainable

    def step(arrays, indices, lr):
        images, labels = next(arrays)
        x, y = tf.gather(images, indices), tf.gather(labels, indices)
        seen = store.updates.read_value()
        with tf.control_dependencies([seen]):  # Pull after reading the counter.
            with tf.GradientTape() as tape:
                logits = store.logits(x, training=True)
                per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
                loss = tf.reduce_sum(per_example) / tf.cast(tf.shape(y)[0], logits.dtype)
        grads = tape.gradient(loss, variables)
        pushed = [v.assign_sub(tf.cast(lr, v.dtype) * tf.cast(g, v.dtype))
                  for v, g in zip(variables, grads)]
        with tf.control_dependencies(pushed):
            applied = store.updates.assign_add(1)
        return loss, count_correct(logits, y), applied - 1 - seen

    return tf.function(step)


def make_eval_step(store: Store):
    """``step(arrays, indices) -> (summed loss, correct)`` on one worker."""

    def step(arrays, indices):
        images, labels = next(arrays)
        x, y = tf.gather(images, indices), tf.gather(labels, indices)
        logits = store.logits(x, training=False)
        return (tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)),
                count_correct(logits, y))

    return tf.function(step)


def train(config, started, coordinator, num_workers, store, arrays, examples, first_step,
          backups, watch, stall):
    """Every epoch's steps, scheduled on the workers (at most two in flight per worker), then
    evaluation, the epoch's line with its staleness, and a backup. ``stall`` ends the run when
    a step's result, the evaluation or the parameters do not come within
    --collective_timeout: a server or worker cut off leaves TensorFlow waiting for ever."""
    plan, reporter = started.plan, started.reporter
    steps = plan.steps_per_epoch
    first_epoch, offset = divmod(first_step, steps)
    if first_epoch >= config.epochs:
        return
    train_step = make_train_step(store)
    eval_step = make_eval_step(store)
    train_arrays, test_arrays = iter(arrays["train"]), iter(arrays["test"])
    window = 2 * num_workers
    batches = iter(data.train_indices(examples[0], plan.global_batch, config.seed, first_epoch,
                                      config.epochs, config.steps_per_epoch).skip(offset))
    global_step = scheduled = first_step  # Steps done; steps handed to the coordinator.
    watch.step, watch.training = first_step, True

    def save():
        with stall.watching(READING):
            weights = store.weights()
        return backups.save(global_step, weights)

    for epoch in range(first_epoch, config.epochs):
        first = offset if epoch == first_epoch else 0
        progress = reporter.progress(epoch, steps)
        loss_sum = correct = seen = 0
        staleness = []
        in_flight = collections.deque()

        def collect():
            nonlocal loss_sum, correct, seen, global_step
            value, n, i = in_flight.popleft()
            with stall.watching(f"training step {global_step + 1}"):
                loss, right, stale = (np.asarray(v) for v in value.fetch())
            if not np.isfinite(loss):
                raise Diverged(float(loss), epoch, i + 1, steps)
            loss_sum += float(loss) * n
            correct += int(right)
            seen += n
            staleness.append(int(stale))
            global_step += 1
            progress.update(i + 1, [("loss", loss_sum / seen), ("train_acc", correct / seen)])

        start = time.perf_counter()
        for i in range(first, steps):
            if watch.requested:
                while in_flight:
                    collect()
                raise Preempted(global_step, save())
            indices = next(batches)
            lr = schedule.learning_rate(scheduled, plan.base_lr, plan.peak_lr,
                                        plan.warmup_steps)
            in_flight.append((coordinator.schedule(
                train_step, args=(train_arrays, indices, tf.constant(lr, tf.float32))),
                int(indices.shape[0]), i))
            scheduled += 1
            while len(in_flight) >= window:
                collect()
        while in_flight:
            collect()
        seconds = time.perf_counter() - start
        with stall.watching(f"evaluating epoch {epoch + 1}"):
            test_loss, test_acc = _evaluate(coordinator, eval_step, test_arrays, examples[1],
                                            plan)
        reporter.epoch_end(epoch, loss=loss_sum / seen, train_acc=correct / seen,
                           test_loss=test_loss, test_acc=test_acc, seconds=seconds, examples=seen,
                           resumed_at=first, extra={
                               "staleness_mean": float(np.mean(staleness)),
                               "staleness_max": int(np.max(staleness))},
                           note=f", staleness mean {np.mean(staleness):.2f} max "
                                f"{np.max(staleness)}")
        saved = save()
        if watch.requested:
            raise Preempted(global_step, saved)
    watch.training, watch.step = False, global_step


def _evaluate(coordinator, eval_step, test_arrays, num_examples, plan) -> tuple:
    """(mean loss, accuracy) over the test batches, scheduled on the workers."""
    results = [coordinator.schedule(eval_step, args=(test_arrays, indices)) for indices in
               data.eval_indices(num_examples, plan.global_batch, plan.eval_steps)]
    loss = correct = 0
    for value in results:
        batch_loss, batch_correct = value.fetch()
        loss += float(batch_loss)
        correct += int(batch_correct)
    return loss / plan.eval_examples, correct / plan.eval_examples

