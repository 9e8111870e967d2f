"""``--num_gpus`` -> the device names a run trains on, and thread pools that let them run together.

k physical GPUs are used as they are. With fewer, what exists is split into k logical devices
(virtual GPUs on a GPU, logical CPU devices otherwise), so the data-parallel code is the same
everywhere. This must happen before TensorFlow runs its first op; once the runtime has started,
the devices already configured are reused (tests configure four logical CPUs once per process).
"""

import hashlib
import os
import subprocess
import sys
import time

import tensorflow as tf

from tfdp.util.errors import UserError
from tfdp.util.logs import logger

# A virtual GPU needs an explicit memory budget; each logical GPU gets this much.
VIRTUAL_GPU_MEMORY_MB = 2048


def available_cores() -> int:
    """CPU cores this process may run on (the launcher narrows it per worker)."""
    return len(os.sched_getaffinity(0))


def configure_devices(num_devices: int) -> list:
    """Return ``num_devices`` device names, creating logical devices when there are too few."""
    if num_devices < 1:
        raise UserError(f"--num_gpus must be a positive integer, got {num_devices}")
    gpus = tf.config.list_physical_devices("GPU")
    kind, physical = ("GPU", gpus) if gpus else ("CPU", tf.config.list_physical_devices("CPU"))
    if len(physical) < num_devices:
        config = (tf.config.LogicalDeviceConfiguration(memory_limit=VIRTUAL_GPU_MEMORY_MB)
                  if kind == "GPU" else tf.config.LogicalDeviceConfiguration())
        try:
            tf.config.set_logical_device_configuration(physical[0], [config] * num_devices)
            logger.info("%d %s(s) found: splitting %s into %d logical devices", len(physical),
                        kind, physical[0].name, num_devices)
        except RuntimeError:
            pass  # The runtime is already up: use the logical devices it has, checked below.
    if kind == "CPU":
        share_cores(num_devices)
    logical = [d.name for d in tf.config.list_logical_devices(kind)]
    if len(logical) < num_devices:
        raise UserError(f"--num_gpus={num_devices}, but this process already runs TensorFlow on "
                        f"{len(logical)} {kind} device(s), fixed when TensorFlow started: start a "
                        "new process (in a notebook, restart the kernel), and run the largest "
                        f"device count first or call tfdp.configure_devices({num_devices}) "
                        "before any run")
    return logical[:num_devices]


def use_gpus(num_gpus: int) -> list:
    """Hide the GPUs past the first ``num_gpus`` from TensorFlow, before its runtime starts:
    a strategy that takes every visible GPU (``MultiWorkerMirroredStrategy``) then takes what
    ``--num_gpus`` says. Returns the GPUs used."""
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) > num_gpus:
        tf.config.set_visible_devices(gpus[:num_gpus], "GPU")
        logger.info("%d GPUs visible: training on the first %d (--num_gpus)", len(gpus), num_gpus)
    return gpus[:num_gpus]


def share_cores(num_devices: int) -> None:
    """Give each of k logical CPU devices its own share of the cores.

    By default every op may use every core (intra-op) and only a couple of ops run at once
    (inter-op), so k replicas queue behind each other. intra = cores / k and inter = k lets the
    k replicas' ops run side by side (docs/benchmarks.md, "Figures behind code comments").
    """
    intra, inter = thread_shares(num_devices)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:
        pass  # Already initialised (a second run in one process): keep what it has.


def thread_shares(num_devices: int) -> tuple:
    """(intra-op, inter-op) threads for ``num_devices`` logical CPU devices (``share_cores``):
    TensorFlow's own ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS``, where set, win
    (the benchmark tunes Keras ``fit`` with them)."""
    intra, inter = max(1, available_cores() // num_devices), max(2, num_devices)
    return (_threads_from_env("TF_NUM_INTRAOP_THREADS", intra),
            _threads_from_env("TF_NUM_INTEROP_THREADS", inter))


def _threads_from_env(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"{name}={value!r}: give a positive number of threads, or unset it")
    return int(value)


def matmul_gflops(dtype: str = "float32", n: int = 2048, repeats: int = 10,
                  seconds: float = 1.0) -> float:
    """The machine's practical ceiling in ``dtype``: the best of ``repeats`` n x n matmuls on
    the default device (all cores on a CPU), in GFLOP/s; fewer (at least 3) where they take
    more than ``seconds`` (a dtype without units of its own: the best of 3 is as good there)."""
    a = tf.cast(tf.random.normal([n, n]), dtype)
    tf.linalg.matmul(a, a).numpy()  # Warm-up: kernels chosen, memory allocated.
    best, spent = float("inf"), 0.0
    for done in range(repeats):
        if done >= 3 and spent > seconds:
            break
        start = time.perf_counter()
        tf.linalg.matmul(a, a).numpy()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return 2 * n ** 3 / best / 1e9


def bfloat16_speed(cache_dir: str = None) -> float:
    """How fast this machine multiplies matrices in bfloat16, as a fraction of float32
    (measured: CPU flags promise more than some machines keep, e.g. avx512_bf16 without AMX ran
    at 0.54x). Measured once per machine and TensorFlow version, and cached in ``cache_dir``
    (default ``$XDG_CACHE_HOME/tfdp`` or ``~/.cache/tfdp``), a file per machine: a launcher's
    worker narrowed to fewer cores keeps its own figure beside the whole machine's, rather than
    replacing it. A damaged cache is measured anew."""
    import json

    from tfdp.util import files

    folder = cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tfdp")
    machine = _machine()
    key = hashlib.sha1(machine.encode()).hexdigest()[:12]
    path = os.path.join(folder, f"bfloat16-speed-{key}.json")
    try:
        with open(path) as f:
            cached = json.load(f)
        if cached.get("machine") == machine:
            return float(cached["ratio"])
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        logger.warning("measuring bfloat16's speed again: %s is damaged (%s)", path, e)
    ratio = _bfloat16_ratio_in_a_child()
    try:
        os.makedirs(folder, exist_ok=True)
        files.write_atomic(path, lambda f: json.dump({"machine": machine, "ratio": ratio}, f))
    except OSError:
        pass  # A cache it cannot keep: measured again next time.
    return ratio


def _bfloat16_ratio_in_a_child() -> float:
    """bfloat16's matmul speed over float32's, measured in a process of its own: TensorFlow
    fixes its devices at its first op, and ``--precision=auto`` is resolved before the run
    makes its devices (measured here, it left a 2-device run on 1 device)."""
    code = ("from tfdp.util import devices; print(devices.matmul_gflops('bfloat16', n=1024, "
            "repeats=20) / devices.matmul_gflops('float32', n=1024, repeats=20))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if done.returncode != 0:
        raise UserError("measuring bfloat16's speed failed: "
                        + (done.stderr.strip().splitlines() or ["no output"])[-1])
    return float(done.stdout.split()[-1])


def _machine() -> str:
    """What the bfloat16 measurement depends on: the processor, the GPUs, TensorFlow."""
    cpu = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "flags", "Features"):
                    cpu.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = cpu.get("flags") or cpu.get("Features", "")
    model = f"{cpu.get('model name', '')} ({hashlib.sha1(flags.encode()).hexdigest()[:12]})"
    gpus = [tf.config.experimental.get_device_details(g).get("device_name", "GPU")
            for g in tf.config.list_physical_devices("GPU")]
    return f"{model}; {available_cores()} cores; GPUs {gpus}; TensorFlow {tf.__version__}"
