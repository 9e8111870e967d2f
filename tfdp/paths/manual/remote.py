"""The from-scratch path across machines: the client's side of a cluster of ``tfdp.server``s.

With a ``TF_CONFIG`` whose cluster names ``worker``s and this process as the ``chief``, the
textbook's code runs unchanged on remote devices: ``tf.device`` accepts
``/job:worker/replica:0/task:1/device:CPU:0`` once this process has joined the cluster
(``tf.config.experimental_connect_to_cluster``), and TensorFlow's distributed runtime runs
each device's part of the compiled step on that device's worker, sending tensors between
workers directly. This process, the client, holds no replica.

1. ``connect``: join the cluster, take ``--num_gpus`` devices of every worker.
2. The data, as on a real cluster (section 12.7.3, step 1): every worker reads the arrays from
   its own disk (``tfdp.server`` prepared them; ``pipeline.read_npy`` placed on the worker) into a
   variable there; each step the client sends only the global batch's example indices, and
   every device gathers its shard from its worker's arrays. No image passes through the client.
3. Faults: SIGTERM to a worker's ``tfdp.server`` preempts the cluster: the chief finds its
   flag (``preempted_worker``, asked every second between calls), saves the step every replica
   finished and exits 75 (``tfdp.cluster.tf_server``). A worker that dies makes the next step
   raise (``UnavailableError``), and the client backs up the newest whole step a replica of
   a worker still ``answering`` holds (``tfdp.paths.manual.trainer``); a worker cut off makes
   it wait, and TensorFlow sets no deadline, so ``tfdp.cluster.stall.Stall`` ends the process
   when one call outlasts ``--collective_timeout``. Both end in one line naming the
   unreachable workers.
"""

import dataclasses
import os
import threading
import time
from typing import Optional

import tensorflow as tf

from tfdp import paths
from tfdp.cluster import tf_config
from tfdp.cluster.stall import STARTING, Stall, read_after_a_loss
from tfdp.cluster.tf_server import LISTENING, PREEMPTED
from tfdp.config.plan import shard_sizes
from tfdp.data import array_cache, pipeline, sources
from tfdp.paths.manual.feed import EVAL, TEST, TRAIN, Feed
from tfdp.trace import arrivals
from tfdp.util.errors import UserError
from tfdp.util.logs import logger

JOB = "worker"
INDICES = tf.TensorSpec([None], tf.int32)


def task_of(wait: float = 60.0) -> Optional[tf_config.Task]:
    """This process's task when ``TF_CONFIG`` makes it the client of workers, else None (its
    hosts' names waited for up to ``wait`` seconds)."""
    if not os.environ.get(tf_config.ENV):
        return None
    return tf_config.client_task(
        paths.get("manual").program, (JOB,),
        "--strategy=manual trains on their devices: add their host:port under \"worker\", or "
        "unset it to train here", wait)


@dataclasses.dataclass
class Cluster:
    task: tf_config.Task
    devices: list          # every worker's devices, worker 0's first
    worker_of: list        # the worker index of each device
    arrays: dict           # split -> [(images, labels) variables on each worker]
    examples: dict         # split -> number of examples
    stall: Stall
    dataset: object        # tfdp.data.sources.DatasetInfo, as worker 0 prepared it

    def shards(self, split: str, indices, flip: bool = False) -> list:
        """One ``(images, labels)`` shard per device, gathered on its worker from the worker's
        own arrays: the split of ``split_batch``, applied to indices (with ``flip``, index
        ``i + n`` mirrored: ``pipeline.gather``)."""
        sizes = tf.stack(shard_sizes(tf.shape(indices)[0], len(self.devices)))
        placed = []
        for device, worker, part in zip(self.devices, self.worker_of, tf.split(indices, sizes)):
            images, labels = self.arrays[split][worker]
            with tf.device(device):
                placed.append(pipeline.gather(images, labels, part, flip))
        return placed

    def feed(self, config, plan) -> Feed:
        """Each step's example indices, in ``pipeline.train_batches``' order: the same batches, and
        the same shard on each device, as on one machine."""
        flip = config.augment == "flip"

        def train_batches(first_epoch, offset):
            return pipeline.index_batches(self.examples[TRAIN], plan.global_batch, config.seed,
                                      first_epoch, offset, config.epochs,
                                      plan.steps_per_epoch, flip)

        def eval_batches(split):
            return pipeline.eval_indices(self.examples[split], plan.micro_batch,
                                         plan.eval_steps).map(lambda i: (i,))

        return Feed([INDICES], train_batches, lambda: eval_batches(EVAL),
                    lambda split, indices: self.shards(split, indices, flip and split == TRAIN),
                    lambda: eval_batches(TEST))

    def preempted_worker(self) -> Optional[str]:
        """What preempted the cluster, if a worker's ``tfdp.server`` got a SIGTERM ("SIGTERM to
        worker 1 at host:port"; its flag is read where it is, one eager op on each worker: in
        a ``tf.function`` Grappler folds the file listing into a constant, read once)."""
        with self.stall.watching("asking the workers whether one was preempted"):
            for w, (name, address) in enumerate(self.stall.peers):
                with tf.device(_cpu(w)):
                    if int(tf.size(tf.io.matching_files(PREEMPTED))):
                        return f"SIGTERM to {name} at {address}"
        return None

    def unresponsive(self, seconds: float = 10.0) -> list:
        """The workers ``[(name, address)]`` that do not run a trivial op within ``seconds``:
        a stopped or hung process, whose port the kernel still answers. Each is asked again
        for the whole ``seconds``: after a loss a survivor's first asks can fail with the lost
        peer's error, for longer under load, and one named here is taken for hung (its replica
        not read, ``answering``); so a worker that is gone takes the whole ``seconds`` to be
        named, which the stall watchdog spends after its ``--collective_timeout``."""
        answered = {}

        def ask(w):
            try:  # Asked again: the stall probe's single asks time steps, these follow a loss.
                read_after_a_loss(lambda: self.ask(w), seconds)
            except tf.errors.OpError:  # Gone, or no longer readable from here.
                return
            answered[w] = True

        askers = [threading.Thread(target=ask, args=(w,), daemon=True)
                  for w in range(len(self.stall.peers))]
        for asker in askers:
            asker.start()
        deadline = time.monotonic() + seconds
        for asker in askers:
            asker.join(max(0.0, deadline - time.monotonic()))
        return [peer for w, peer in enumerate(self.stall.peers) if w not in answered]

    def answering(self, seconds: float = 2.0) -> set:
        """The devices whose worker runs a trivial op within ``seconds``, asked now: after a
        loss, the replicas that may still be read."""
        silent = set(self.unresponsive(seconds))
        return {device for device, w in zip(self.devices, self.worker_of)
                if self.stall.peers[w] not in silent}

    @staticmethod
    def ask(worker: int) -> None:
        """A trivial op on ``worker``, its answer waited for: it answers unless its process is
        stopped, hung or gone."""
        with tf.device(_cpu(worker)):
            tf.identity(tf.constant(0)).numpy()

    def describe(self) -> str:
        workers = ", ".join(f"worker {i} ({a})" for i, a in enumerate(self.task.cluster[JOB]))
        return f"{len(self.devices)} remote device(s) on {workers}: {self.devices}"


def connect(task: tf_config.Task, config, kept_steps=lambda: []) -> Cluster:
    """Join the cluster as its chief, take ``config.num_gpus`` devices of each worker, and have
    every worker load the data (``--dataset``) from its own disk."""
    num_gpus, timeout = config.num_gpus, config.collective_timeout
    peers = tf_config.job_peers(task, (JOB,))
    stall = Stall(timeout, peers, kept_steps)
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(task.cluster),
                                              job_name="chief", task_index=0)
    with stall.watching(STARTING):
        listed = [d.name for d in tf.config.list_logical_devices()]
    devices, worker_of = [], []
    for w, (name, address) in enumerate(peers):
        prefix = f"/job:{JOB}/replica:0/task:{w}/device:"
        own = [d for d in listed if d.startswith(prefix + "GPU:")] or [
            d for d in listed if d.startswith(prefix + "CPU:")]
        if len(own) < num_gpus:
            raise UserError(f"{name} ({address}) serves {len(own)} device(s), --num_gpus="
                            f"{num_gpus} asks for {num_gpus} per worker: start its tfdp.server "
                            f"with --num_gpus={num_gpus}")
        devices += own[:num_gpus]
        worker_of += [w] * num_gpus
    for w in range(len(peers)):  # A SIGTERM to its server is now the cluster's preemption.
        with tf.device(_cpu(w)):
            tf.io.write_file(LISTENING, "")
    dataset = pipeline.dataset_on(_cpu(0), "{} ({})".format(*peers[0]), config)
    folder = dataset.folder
    arrays, examples = {}, {}
    for use, split in dataset.uses.items():
        with stall.watching(f"loading the {split} split on the workers"):
            arrays[use] = [_load(w, name, address, dataset, split)
                           for w, (name, address) in enumerate(peers)]
            examples[use] = _check_same(split, arrays[use], peers)
    logger.info("data: %s examples, read by each of the %d workers from its own %s",
                sources.counted({split: examples[use] for use, split in dataset.uses.items()}),
                len(peers), folder)
    cluster = Cluster(task, devices, worker_of, arrays, examples, stall, dataset)
    stall.unresponsive = cluster.unresponsive  # For the line of a call that outlasts the timeout.
    stall.probe(cluster.ask, arrivals.PAUSE_S)  # A worker paused, named whatever it was doing.
    return cluster


def _cpu(worker: int) -> str:
    return f"/job:{JOB}/replica:0/task:{worker}/device:CPU:0"


def _load(worker: int, name: str, address: str, dataset, split: str) -> tuple:
    """Variables on the worker's CPU holding its ``split`` arrays, read there from its disk."""
    folder = dataset.folder
    try:
        with tf.device(_cpu(worker)):
            images, labels = pipeline.read_arrays(folder, split, dataset.image_shape)
            return (tf.Variable(images, trainable=False, name=f"{split}_images"),
                    tf.Variable(labels, trainable=False, name=f"{split}_labels"))
    except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as e:
        raise UserError(f"{name} ({address}) cannot read the {split} split at "
                        f"{array_cache.array_paths(folder, split)[0]} "
                        f"({e.message.splitlines()[0][:120]}): start its tfdp.server with this "
                        "--data_dir (it prepares the data there), the same on every machine"
                        ) from None


def _check_same(split: str, arrays: list, peers: list) -> int:
    """The split's size, after checking on every worker that its arrays are the client's
    expectation of one dataset: equal sizes and checksums (two numbers cross the network)."""
    sums = []
    for images, labels in arrays:
        with tf.device(images.device):
            sums.append((int(tf.shape(labels)[0]),
                         int(tf.reduce_sum(tf.cast(images, tf.int64))),
                         int(tf.reduce_sum(labels * tf.range(tf.shape(labels, tf.int64)[0])))))
    for (name, address), found in zip(peers[1:], sums[1:]):
        if found != sums[0]:
            raise UserError(f"{name} ({address}) holds a different {split} split from worker 0 "
                            f"(examples, pixel sum, label checksum: {found} against {sums[0]}): "
                            "prepare the same Fashion-MNIST release on every machine")
    return sums[0][0]
