"""A TensorFlow server of a cluster whose client runs ``tfdp.train`` (``python -m tfdp.server``
is its command line): its devices, its data, and its life until the chief has gone.

It prepares the data where the worker is (the client's steps read each device's shard here,
``tfdp.paths.manual.remote``; the parameter-server path's per-worker datasets too), starts the server
with ``--num_gpus`` devices, and serves until the client, seen once, has gone.

SIGTERM to a server whose client listens for it (the from-scratch path's chief writes
``LISTENING`` into the server's in-memory file system when it joins) is a preemption of the
whole cluster: the server writes ``PREEMPTED`` there and goes on serving; the chief, which
looks for it every second (an op placed on this server's CPU reads this process's ``ram://``
files), saves the step every replica finished and exits 75; then the server exits 75 too. A
second SIGTERM, or a client that does not listen (parameter servers'), stops it at once.
"""

import signal
import time

from tfdp.cluster import tf_config
from tfdp.util import logs
from tfdp.util.errors import PREEMPTED_EXIT_CODE, UserError

JOBS = ("worker", "ps")
# Files in the server process's own memory (TensorFlow's ram:// file system): nothing is left on
# a disk, and no two servers on one machine share them.
LISTENING = "ram://tfdp/chief-listens-for-preemption"
PREEMPTED = "ram://tfdp/preempted"
# How long a preempted server waits for its chief to save and go.
PREEMPT_GRACE = 60.0
# How often the client's port is probed: often enough to see a client that connects and
# refuses to run within a second (a wrong --num_gpus), which would otherwise be missed and
# leave the server waiting for ever. How long the port must stay shut before the client counts
# as gone: a busy client may be slow to accept one connection.
_POLL_SECONDS = 0.1
_GONE_AFTER_SECONDS = 3.0


def serve(task: tf_config.Task, num_gpus: int, data: dict = None, wait: float = 60.0) -> str:
    """Prepare the ``data`` (``tfdp.data.sources.prepare``'s keywords: ``dataset``, ``data_dir``,
    ``manual_dir``, ``image_size``, ``validation_split``, ``seed``; None: none), start the
    server, return when the chief has come and gone (raise when it was cut off instead);
    ``wait``: seconds for the cluster's names to resolve."""
    if "chief" not in task.cluster:
        raise UserError(f"{tf_config.ENV} names no chief: the chief is the client, the process "
                        "running python -m tfdp.train")
    if num_gpus < 1:
        raise UserError(f"--num_gpus must be a positive integer, got {num_gpus}")
    tf_config.check_addresses(task, wait)
    tf = logs.import_tensorflow()
    where = _prepare_data(**data) if data is not None and task.type == "worker" else None
    server = tf.distribute.Server(tf.train.ClusterSpec(task.cluster), job_name=task.type,
                                  task_index=task.index, protocol="grpc",
                                  config=_session_config(tf, num_gpus), start=True)
    kind = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    chief = task.cluster["chief"][0]
    names = [f"/job:{task.type}/replica:0/task:{task.index}/device:{kind}:{d}"
             for d in range(num_gpus)]
    data = f"data in {where}" if where else "no data"
    print(f"tfdp.server: {task.type} {task.index} at {task.address} serves {', '.join(names)}; "
          f"{data}; until the chief at {chief} finishes", flush=True)
    stop = _Stop(tf, chief)
    signal.signal(signal.SIGTERM, stop)
    try:
        how = _wait_for_client(chief, stop)
    finally:
        # The server is ending: a SIGTERM now is the launcher stopping what is left of the
        # group, and one that came during the interpreter's exit raised in an atexit callback
        # (a traceback after the server's last line). The launcher's SIGKILL follows its grace.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    del server
    if stop.preempted:
        raise stop.ended(how == tf_config.REFUSES)
    if how == tf_config.SILENT:
        raise UserError(f"lost the chief at {chief}: no answer for {_GONE_AFTER_SECONDS:g} s (a "
                        "link down, or its machine gone); stopping")
    return chief


class Stopped(Exception):
    """The server ends with ``code`` and one line, ``message``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class _Stop:
    """The server's SIGTERM handler: a preemption the chief saves for, when it listens.

    The handler only counts; the wait loop acts (``check``) between its polls. Raised from the
    handler, ``Stopped`` came out of whatever the signal interrupted: TensorFlow's file calls
    (pybind11's "MISMATCH of original and normalized active exception types"), or the handler
    itself, taken again by the next SIGTERM of a burst."""

    def __init__(self, tf, chief: str):
        self.tf, self.chief, self.preempted, self.since = tf, chief, False, None
        self.taken = []  # Appended by the handler, popped by check: each a single step.

    def __call__(self, signum, frame):
        self.taken.append(signum)

    def check(self):
        """Act on the SIGTERMs taken since the last check, in order: raise ``Stopped`` when the
        server is to stop now."""
        taken = 0
        while self.taken:  # A SIGTERM between two pops is counted, not lost.
            self.taken.pop()
            taken += 1
        if not taken:
            return
        chief_gone = tf_config.answer(self.chief, timeout=0.5) != tf_config.ACCEPTS
        for _ in range(taken):
            self._one(chief_gone)

    def _one(self, chief_gone: bool):
        if self.preempted:  # Again: from a launcher whose chief has stopped, or to hurry.
            raise self.ended(chief_gone, "stopped at once (a second SIGTERM)")
        if not self.tf.io.gfile.exists(LISTENING):
            raise Stopped(0, "stopped (SIGTERM)")
        if chief_gone:
            raise Stopped(0, f"stopped (SIGTERM): the chief at {self.chief} has gone")
        self.tf.io.write_file(PREEMPTED, "SIGTERM")
        self.preempted, self.since = True, time.monotonic()
        print(f"tfdp.server: SIGTERM: asking the chief at {self.chief} to save the cluster's "
              "step; stopping when it has", flush=True)

    def ended(self, chief_gone: bool, otherwise: str = None) -> Stopped:
        """How a preempted server ends: its chief gone, or ``otherwise`` (default: the
        chief outlived the grace)."""
        if chief_gone:
            return Stopped(PREEMPTED_EXIT_CODE,
                           f"preempted (SIGTERM); the chief at {self.chief} has stopped")
        return Stopped(PREEMPTED_EXIT_CODE, otherwise or f"preempted (SIGTERM); the chief at "
                       f"{self.chief} did not stop within {PREEMPT_GRACE:g} s")


def _prepare_data(dataset, data_dir, manual_dir, image_size, validation_split, seed) -> str:
    """Prepare the dataset and leave its arrays where the client's steps read them."""
    from tfdp.data import sources

    where = sources.cache_folder(dataset, data_dir, image_size)
    folder = sources.prepare(dataset, data_dir, manual_dir, image_size, validation_split,
                             seed).folder
    # Kept in the user's cache: the data dir is read-only here (a split's folder is the
    # dataset's name and its own suffix).
    if not folder.startswith(where):
        raise UserError(f"cannot leave the arrays the client reads in {where} (not writable?): "
                        "give a --data_dir this worker can write to, the same on every machine")
    return folder


def _session_config(tf, num_gpus: int):
    """The server's devices: ``num_gpus`` GPUs, or logical devices where there are fewer (as
    ``tfdp.util.devices`` makes them in one process, here through the server's ConfigProto)."""
    from tfdp.util import devices

    config = tf.compat.v1.ConfigProto()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) >= num_gpus:
            config.gpu_options.visible_device_list = ",".join(map(str, range(num_gpus)))
        else:
            config.gpu_options.visible_device_list = "0"
            config.gpu_options.experimental.virtual_devices.add(
                memory_limit_mb=[devices.VIRTUAL_GPU_MEMORY_MB] * num_gpus)
    else:
        config.device_count["CPU"] = num_gpus
        intra, inter = devices.thread_shares(num_gpus)
        config.intra_op_parallelism_threads = intra
        config.inter_op_parallelism_threads = inter
    return config


def _wait_for_client(chief: str, stop: _Stop) -> str:
    """Until the chief's port has answered once and then stopped answering (once preempted: at
    its first refusal, or after ``PREEMPT_GRACE``); how it last answered: ``tf_config.REFUSES``
    (the chief has gone), ``tf_config.SILENT`` (cut off), or ``tf_config.ACCEPTS`` (preempted,
    and the chief still there)."""
    last_answer = None
    while True:
        stop.check()
        found = tf_config.answer(chief)
        now = time.monotonic()
        if found == tf_config.ACCEPTS:
            last_answer = now
        elif stop.preempted and found == tf_config.REFUSES:
            return found
        elif last_answer is not None and now - last_answer >= _GONE_AFTER_SECONDS:
            return found
        if stop.preempted and now - stop.since >= PREEMPT_GRACE:
            return found
        time.sleep(_POLL_SECONDS)
