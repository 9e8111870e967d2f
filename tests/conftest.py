"""Shared test set-up: four logical CPU devices per test process, the real data, prepared
once per session from the Fashion-MNIST files (``$TFDP_MANUAL_DIR`` or the shared folder), and
the helpers tests share: a process's environment and children, launching a cluster, runs to
compare.

Set ``TFDP_TEST_DATA_DIR`` to keep the prepared TFDS data between sessions (.ci/run does).

Markers (setup.cfg): ``slow`` (a long single-process run), ``cluster`` (several processes: the
launcher, tfdp.server), ``root(why)`` (Linux and root: namespaces, mounts; skipped elsewhere,
saying why). The quick tier is ``-m "not slow and not cluster and not root"``.
"""

import json
import os
import signal
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tfdp import data, devices, fashion_mnist  # noqa: E402
from tfdp.models import lenet  # noqa: E402

# Logical devices must exist before TensorFlow runs its first op; tests take the first k.
DEVICES = devices.configure_devices(4)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.geteuid() == 0 and sys.platform.startswith("linux")


def pytest_collection_modifyitems(config, items):
    """A test marked ``root(why)`` skips, saying why, where this is not Linux run as root."""
    for item in items:
        mark = item.get_closest_marker("root")
        if mark and not ROOT:
            why = mark.args[0] if mark.args else "network namespaces, mounts"
            item.add_marker(pytest.mark.skip(reason=f"needs Linux and root ({why})"))


@pytest.fixture(autouse=True)
def fresh_collective_keys():
    """Each test's MirroredStrategy gets collective group keys of its own, as TensorFlow's own
    tests do (``strategy_combinations.py``): otherwise a strategy over 3 devices reuses the
    group key of an earlier one over 2, and its all-reduce fails ("joining a group with size 3,
    but that group has size 2")."""
    import tensorflow as tf

    tf.distribute.MirroredStrategy._collective_key_base += 100000
    yield


@pytest.fixture(scope="session")
def manual_dir():
    found = fashion_mnist.find_manual_dir(None)
    if found is None:
        pytest.fail("Fashion-MNIST files not found: set TFDP_MANUAL_DIR to the folder with the "
                    "four .gz files (../shared/data/fashion_mnist in this workplace)")
    return found


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, manual_dir):
    path = os.environ.get("TFDP_TEST_DATA_DIR") or str(tmp_path_factory.mktemp("tfds"))
    fashion_mnist.prepare(path, manual_dir)
    return path


@pytest.fixture(scope="session")
def train_split(data_dir):
    return data.load_split("train", data_dir)


@pytest.fixture(scope="session")
def test_split(data_dir):
    return data.load_split("test", data_dir)


def head(split, n):
    """The first ``n`` examples of a split: a small real slice."""
    return data.Split(split.images[:n], split.labels[:n])


def child_env(**extra) -> dict:
    """The environment of a process a test starts: this one's, TensorFlow's C++ INFO hidden."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **extra)


def run_module(module, *args, env=None, timeout=600, cwd=None):
    """Run ``python -m module args`` in a fresh process; return the CompletedProcess."""
    full_env = dict(os.environ, **(env or {}))
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd or REPO)


def launch(folder, strategy, *train_args, launcher=("--num_workers=2",), popen=False,
           timeout=300, stderr=subprocess.PIPE, env=None):
    """``python -m tfdp.launch <launcher> -- --strategy=<strategy> --workdir=<folder>/run
    --export_dir=<folder>/export <train_args>``: finished (a CompletedProcess), or running
    (``popen``: a Popen with its output piped; ``stderr=subprocess.STDOUT`` merges it).
    ``env``: variables to add to the launcher's environment."""
    args = [sys.executable, "-m", "tfdp.launch", *launcher, "--", f"--strategy={strategy}",
            f"--workdir={folder / 'run'}", f"--export_dir={folder / 'export'}", *train_args]
    environment = child_env(**(env or {}))
    if popen:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env=environment, cwd=REPO)
    return subprocess.run(args, capture_output=True, text=True, env=environment, cwd=REPO,
                          timeout=timeout)


def children(pid) -> list:
    """The pids of process ``pid``'s children (none once it has gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return []


def comparable_start(seed=3, dtype=np.float32):
    """Glorot weights with the first conv bias at 0.05, for comparing runs in float32.

    Fashion-MNIST is mostly exact-zero background, where the first conv's input to ReLU is
    exactly b1. The textbook starts b1 at zero; float32 rounding then leaves b1 entries of either
    sign, flipping ReLU's derivative at ~10^5 positions per batch, so two correct runs that
    differ only in summation order drift apart by percents within a few dozen steps (float64,
    too fine to flip, does not). Away from zero the runs agree to ~1e-6 per update, until the
    same happens one layer up: all background positions share one conv-2 input per channel,
    and when a channel's crosses zero the float32 runs may cross it a step apart (seen after 2
    steps on one CPU, 10-15 on another). Whole runs are therefore compared in float64, and
    float32 one step at a time from equal weights (tests/test_manual_trainer.py).
    """
    params = lenet.init_params(seed, dtype, "glorot")
    params["b1"] = np.full_like(params["b1"], 0.05)
    return params


def update_difference(a, b, start):
    """max over parameters of |a - b| / |b - start|: how far two runs' updates disagree."""
    return max(np.linalg.norm(a[n] - b[n]) / np.linalg.norm(b[n] - start[n]) for n in a)


def train_manual(config, devices, train_split, test_split, reporter, params=None):
    """The manual path's loop on given splits, with the plan its ``run`` would make."""
    from tfdp.manual import trainer
    from tfdp.plan import make_plan
    from tfdp.training.skeleton import Run

    plan = make_plan(config, len(devices), len(train_split.labels), len(test_split.labels))
    return trainer.train(Run(config, plan, reporter, devices, train_split=train_split,
                             test_split=test_split), params)


def served_disagreement(version, trained, start, images) -> float:
    """|served logits - ``trained``'s logits| / |how far training moved them|, on ``images``
    (uint8), for an export ``version`` folder against float64 LeNet parameters: the export
    computes in float64 and serves float32 logits, so that rounding only (~1e-7)."""
    import tensorflow as tf

    images = tf.constant(images)
    served = tf.saved_model.load(str(version)).signatures["serving_default"](
        images=images)["logits"].numpy()

    def logits(params):
        return lenet.apply(params, data.to_float(images, tf.float64)).numpy()

    moved = np.linalg.norm(logits(trained) - logits(start))
    return np.linalg.norm(served - logits(trained)) / moved


def wait_for_first_backup(run, tmp_path, timeout=180, step=1):
    """Until the run in ``tmp_path / "run"`` has saved its first backup (an epoch's end), or
    one of global step ``step`` or later."""
    from tfdp.training.backups import Backups

    backups = Backups(str(tmp_path / "run"), 0, {})
    deadline = time.time() + timeout
    while (max(backups.steps(), default=0) < step and run.poll() is None
           and time.time() < deadline):
        time.sleep(0.05)
    assert max(backups.steps(), default=0) >= step, "no epoch finished in time"


def cut_off(launcher: int, host: int) -> tuple:
    """Set the link of the launcher's emulated host ``host`` down, its processes left alive:
    (the host's namespace, when)."""
    from tfdp.launcher import emulated_hosts

    name = f"{emulated_hosts.PREFIX}{launcher}-h{host}"
    subprocess.run(["ip", "-n", name, "link", "set", "eth0", "down"], check=True)
    return name, time.time()


def task_pid(launcher: int, kind: str, index: int) -> int:
    """The pid of the launcher's child that runs task ``kind`` ``index`` (by its TF_CONFIG)."""
    launched = children(launcher)
    for pid in launched:
        config = tf_config_of(pid)
        if config and config["task"] == {"type": kind, "index": index}:
            return pid
    raise AssertionError(f"no {kind} {index} among {launched}")


def slow_then_stop(run, folder, kind: str, index: int) -> tuple:
    """Task ``kind`` ``index`` of a launched ``run`` stopped 35 of every 40 ms (real SIGSTOP and
    SIGCONT from outside: a host with an eighth of a CPU) from the moment the cluster has
    started until the run's first backup (its first epoch's end), then stopped for good: hung,
    alive, never answering. The run's (stdout, stderr) once it has ended."""
    from tfdp.training.backups import Backups

    task = None
    try:
        deadline = time.time() + 60
        while task is None and time.time() < deadline:
            try:
                task = task_pid(run.pid, kind, index)
            except AssertionError:
                time.sleep(0.1)
        # Once the cluster has started (the chief's reporter writes its folder), not before:
        # an eighth of a CPU takes TensorFlow's start-up past the timeout.
        while not (folder / "run" / "tensorboard").exists() and run.poll() is None:
            time.sleep(0.05)
        backups = Backups(str(folder / "run"), 0, {})
        while not backups.steps() and run.poll() is None and time.time() < deadline + 120:
            os.kill(task, signal.SIGSTOP)
            time.sleep(0.035)
            os.kill(task, signal.SIGCONT)
            time.sleep(0.005)
        os.kill(task, signal.SIGSTOP)
        return run.communicate(timeout=120)
    finally:
        if task:
            try:
                os.kill(task, signal.SIGCONT)
            except ProcessLookupError:
                pass  # Stopped by the launcher, with the rest of the cluster.


def tf_config_of(pid: int):
    """Process ``pid``'s TF_CONFIG, or None: gone, or between fork and exec (a launched child
    then still has the launcher's environment, without its TF_CONFIG)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
    except OSError:
        return None
    return json.loads(env[b"TF_CONFIG"]) if b"TF_CONFIG" in env else None


class Terminal:
    """A command run in a real pseudo-terminal, as in a user's shell: the terminal is its
    controlling one and its process group the foreground one, so typing Ctrl-C (``type``)
    signals it as a shell would. ``text`` is everything it printed so far."""

    def __init__(self, argv, cwd=REPO, env=None):
        import fcntl
        import termios

        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                     env=env or child_env(), cwd=cwd, start_new_session=True,
                                     preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(slave)
        self.output = bytearray()

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    def read_available(self) -> bool:
        """Take what it has printed; False once every process holding the terminal has gone."""
        import select
        while select.select([self.master], [], [], 0)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every process holding the terminal has gone.
                return False
            if not chunk:
                return False
            self.output.extend(chunk)
        return True

    def wait_for(self, predicate, seconds: float, what: str) -> None:
        """Read until ``predicate(self)`` holds; fail after ``seconds`` or if it exits first."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            self.read_available()
            if predicate(self):
                return
            if self.proc.poll() is not None:
                self.read_available()
                pytest.fail(f"exited ({self.proc.returncode}) before {what}:\n{self.text[-3000:]}")
            time.sleep(0.02)
        pytest.fail(f"timed out waiting for {what}:\n{self.text[-3000:]}")

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def finish(self, seconds: float = 60) -> int:
        """Wait for it to exit (killed after ``seconds``); its exit code."""
        deadline = time.time() + seconds
        try:
            while self.proc.poll() is None and time.time() < deadline:
                self.read_available()
                time.sleep(0.05)
            self.read_available()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            os.close(self.master)
        return self.proc.returncode


def lanes_by_step(trace: dict) -> dict:
    """{(worker, lane, step): {classes}} of a merged trace."""
    workers = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
               if e["name"] == "process_name"}
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    found = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["cat"] != "step":
            key = (workers[e["pid"]], lanes[(e["pid"], e["tid"])], e["args"]["step"])
            found.setdefault(key, set()).add(e["cat"])
    return found


def serve_in_clients(version, images, labels, folder, margin=1e-4) -> dict:
    """What ``tests/serving_clients.py`` (a process that never imports tfdp) sees of the export
    ``version`` on ``images`` (uint8) and ``labels``, ``margin`` being how far ONNX's and
    LiteRT's logits may be from TF2's."""
    np.save(folder / "images.npy", images)
    np.save(folder / "labels.npy", labels)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "serving_clients.py"), str(version),
         str(folder / "images.npy"), str(folder / "labels.npy"), str(margin)],
        capture_output=True, text=True, timeout=600, cwd=folder,
        env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def runtimes_agree(seen: dict, examples: int, margin=1e-4) -> None:
    """ONNX Runtime and LiteRT (``serve_in_clients``) give TF2's classes, but for examples whose
    top two logits are within ``margin``, and logits within ``margin`` of their size."""
    for runtime in ("onnx", "litert"):
        assert seen[f"{runtime}_same_classes"] >= 1 - seen["near_ties"] / examples - 1e-9, seen
        assert seen[f"{runtime}_logits"] < margin, seen
