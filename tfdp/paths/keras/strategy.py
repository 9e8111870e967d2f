"""Strategy name -> a ``tf.distribute`` strategy, plus who this process is in the cluster.

``mirrored``: ``MirroredStrategy`` over ``--num_gpus`` devices of this process (logical devices
when there are fewer, as for the manual path). ``multi_worker``: ``MultiWorkerMirroredStrategy``
over the processes named in ``TF_CONFIG``; it must be created before TensorFlow runs anything
else, so this is the first thing the Keras path does.
"""

import contextlib
import dataclasses
import signal
import threading

import tensorflow as tf

from tfdp import paths
from tfdp.cluster import watchdog
from tfdp.cluster import tf_config
from tfdp.util import devices, main_thread
from tfdp.util.errors import UserError
from tfdp.util.logs import logger


@dataclasses.dataclass(frozen=True)
class Distribution:
    strategy: tf.distribute.Strategy
    devices: list          # this worker's devices
    worker_index: int      # 0 for a single process
    num_workers: int
    is_chief: bool         # writes exports, metrics and prints reports
    deadline: object = None  # multi_worker: ends the process if start-up outlasts its timeout

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def started(self) -> None:
        """Start-up is over (every worker answered): cancel the start-up deadline."""
        if self.deadline is not None:
            self.deadline.cancel()

    def describe(self) -> str:
        where = (f"{self.num_workers} workers x {len(self.devices)} device(s)"
                 if self.num_workers > 1 else f"devices {self.devices}")
        kind = ("MultiWorkerMirroredStrategy" if self.num_workers > 1 or isinstance(
            self.strategy, tf.distribute.MultiWorkerMirroredStrategy) else
            type(self.strategy).__name__)
        return f"{kind}, {self.replicas} replica(s) in sync on {where}"


def make_distribution(kind: str, num_gpus: int = 1, collective_timeout: int = 300) -> Distribution:
    """The strategy of ``kind`` (``tfdp.paths.Path.keras_strategy``) over ``num_gpus`` devices
    (logical ones if there are fewer), with thread pools shared out among them;
    ``collective_timeout`` bounds a multi-worker strategy's waits."""
    if kind == paths.MIRRORED:
        names = devices.configure_devices(num_gpus)
        return Distribution(_mirrored_strategy(names), names, 0, 1, True)
    if kind == paths.MULTI_WORKER_MIRRORED:
        return _multi_worker(num_gpus, collective_timeout)
    if kind == paths.KERAS_DEFAULT:  # No replication: plain fit on one device.
        names = devices.configure_devices(1)
        return Distribution(tf.distribute.get_strategy(), names, 0, 1, True)
    kinds = (paths.MIRRORED, paths.MULTI_WORKER_MIRRORED, paths.KERAS_DEFAULT)
    raise UserError(f"{kind!r} is not a strategy Keras fit trains under here: {', '.join(kinds)}")


def _mirrored_strategy(names: list):
    """A MirroredStrategy with collective keys of its own. Every MirroredStrategy of a process
    starts its group and instance keys from one class-wide base, so the all-reduces of a second
    run (another model, in a notebook or tfdp.run called twice) meet the first one's under the
    same keys and fail: "Shape mismatch in the collective instance 100"
    (tensorflow/tensorflow#62790). TensorFlow's own tests move the base for each strategy;
    tests/test_keras_path.py notices when TensorFlow no longer needs it."""
    tf.distribute.MirroredStrategy._collective_key_base += KEYS_PER_STRATEGY
    return tf.distribute.MirroredStrategy(names)


# Far more keys than one strategy's run uses (TensorFlow's tests move the base by as much).
KEYS_PER_STRATEGY = 100000


@contextlib.contextmanager
def sigterm_kept():
    """Around the creation of a ``MultiWorkerMirroredStrategy``: this process's SIGTERM handler
    kept. Creating it starts TensorFlow's coordination service, whose preemption notifier puts
    a SIGTERM handler of its own in the process's place (``sigaction``, behind Python's back:
    ``signal.getsignal`` still names ours), so a SIGTERM from then on (Slurm's preemption, a
    launcher stopping its group for a worker to join) was swallowed, and the run trained on to
    its end (seen with TensorFlow 2.21; no upstream issue found). SIGTERM is held in this
    thread meanwhile (the runtime's threads started inside inherit that), then the handler
    Python has is set again and SIGTERM let through. tests/test_keras_path.py notices when
    TensorFlow no longer replaces it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with main_thread.main_thread_only():
        try:
            yield
        finally:  # Before the block ends: a SIGTERM held meanwhile comes to Python's handler.
            ours = signal.getsignal(signal.SIGTERM)
            if ours is not None:  # None: not set from Python; nothing of ours to put back.
                signal.signal(signal.SIGTERM, ours)


def _multi_worker(num_gpus: int, collective_timeout: int) -> Distribution:
    task = tf_config.task()
    if not devices.use_gpus(num_gpus) and num_gpus != 1:
        raise UserError(f"--num_gpus={num_gpus} with --strategy=multi_worker on a machine "
                        "without GPUs: MultiWorkerMirroredStrategy runs one replica per CPU "
                        "worker; use --num_gpus=1 and more workers")
    if ":" in task.address:  # Named in TF_CONFIG (one worker too): TensorFlow binds its port.
        tf_config.check_addresses(task, collective_timeout)
    with sigterm_kept():
        # Creating the strategy waits for every worker to register, and the first collective
        # for every worker to join: without a deadline a missing peer means waiting forever.
        deadline = watchdog.start(collective_timeout, task.peers) if task.peers else None
        # MWMS configures collectives and must come before the runtime starts: set the thread
        # pools (that does not start it), create the strategy, then ask it for its devices.
        devices.share_cores(num_gpus)
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=collective_timeout)
        try:
            strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        except RuntimeError as e:  # "Collective ops must be configured at program startup".
            if deadline:
                deadline.cancel()
            raise UserError("--strategy=multi_worker must be the first thing TensorFlow does in "
                            f"a process ({e}): run it in a new process, e.g. python -m "
                            "tfdp.launch, or restart the kernel") from e
    names = list(strategy.extended.worker_devices)
    logger.info("multi_worker: task %s/%d of %d workers, chief: %s", task.type, task.index,
                len(task.workers), task.is_chief)
    return Distribution(strategy, names, task.worker_index, len(task.workers), task.is_chief,
                        deadline)
