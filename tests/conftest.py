"""Shared test set-up: four logical CPU devices per test process, the real data, prepared
once per session from the Fashion-MNIST files (``$TFDP_MANUAL_DIR`` or the shared folder), and
the markers. The helpers tests share live beside it, each module one kind: ``processes`` (a
child's environment, launched clusters, faults from outside), ``same_model`` (runs to compare),
``terminal`` (a real pseudo-terminal), ``exports`` (serving clients), ``traces``,
``slurm_cluster`` (a real Slurm on emulated hosts), ``shared_runs`` (small runs trained once a
session for the tests that only read them) and ``zygote`` (the ``python -m tfdp.<command>``
processes started under a test worker, forked from one that has imported TensorFlow).

Set ``TFDP_TEST_DATA_DIR`` to keep the prepared TFDS data between sessions (.ci/run does).

The suite runs in three worker processes (pytest-xdist, ``-n 3`` in setup.cfg): one test at a
time, it kept a 2-core machine's cores 57 % busy, most tests waiting on processes they started
(docs/design.md#tests). What must not run twice at once is a group (``xdist_group``: a real
Slurm, the shared runs), and the groups, the longest units, are handed out first. ``-n 0`` runs
the suite in one process.

Markers (setup.cfg): ``slow`` (a long single-process run), ``cluster`` (several processes: the
launcher, tfdp.server), ``root(why)`` (Linux and root: namespaces, mounts; skipped elsewhere,
saying why). The quick tier is ``-m "not slow and not cluster and not root"``.
"""

import atexit
import contextlib
import fcntl
import os
import shutil
import signal
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The runs tests start draw no charts (the default of --plots: docs/design.md#tests has what
# drawing costs a short run); the tests that read a chart ask for it (--plots, plots=True).
os.environ.setdefault("TFDP_PLOTS", "0")
# Each test process has a folder of its own, inherited by every process it starts and removed
# when it ends: the temporary files (TFDS leaves an empty folder for each builder of a dataset not
# yet prepared; a process a test kills leaves TensorFlow's autograph files) and the suite's
# measurements (bfloat16's speed, made under the suite's own load: never into ~/.cache).
# pytest's own tmp_path folders stay where they were, kept for a failure's post-mortem.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
_OWN = tempfile.mkdtemp(prefix="tfdp-test-")
atexit.register(shutil.rmtree, _OWN, ignore_errors=True)
os.environ["TMPDIR"] = tempfile.tempdir = os.path.join(_OWN, "tmp")
os.environ["XDG_CACHE_HOME"] = os.path.join(_OWN, "cache")
os.makedirs(os.environ["TMPDIR"])

import pytest  # noqa: E402

from tfdp.util import logs  # noqa: E402

logs.import_tensorflow()  # Without its start-up banners (pytest-xdist's workers show them).

from tfdp.data import pipeline, sources, fashion_mnist
from tfdp.util import devices  # noqa: E402

# Logical devices must exist before TensorFlow runs its first op; tests take the first k.
DEVICES = devices.configure_devices(4)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.geteuid() == 0 and sys.platform.startswith("linux")


def pytest_configure(config):
    # An order, not a tier (setup.cfg's markers are the tiers the README names).
    config.addinivalue_line("markers", "early: long and in the test's own process: collected "
                            "right after the groups (pytest_collection_modifyitems)")


def pytest_collection_modifyitems(config, items):
    """A test marked ``root(why)`` skips, saying why, where this is not Linux run as root. The
    tests of an ``xdist_group`` come first (in their order): each group runs on one worker as one
    unit, and a long unit started last would leave the other worker idle at the end; then the
    tests marked ``early`` (long, and training in the test's own process: keras.applications'
    models ended a whole run with one worker alone for 80 s). (All the long tests first made the
    run slower: three launched clusters at once on two cores spent more CPU on the same work;
    docs/design.md#tests.)"""
    for item in items:
        mark = item.get_closest_marker("root")
        if mark and not ROOT:
            why = mark.args[0] if mark.args else "network namespaces, mounts"
            item.add_marker(pytest.mark.skip(reason=f"needs Linux and root ({why})"))
    items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None,
                                 item.get_closest_marker("early") is None))


@contextlib.contextmanager
def only_one_worker(path: str):
    """Held by one test process at a time (the suite's workers share the machine's files); the
    lock goes with the file's closing."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def shared_temp(tmp_path_factory):
    """A folder every worker of this test session sees (each has its own basetemp in it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


# SIGINT, SIGTERM and SIGHUP as this process started with them: what a shell gives a command.
SHELL_SIGNALS = {signum: signal.getsignal(signum)
                 for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


@pytest.fixture(autouse=True)
def signals_as_a_shell_gives_them():
    """Each test starts and ends with this process's SIGINT, SIGTERM and SIGHUP as it started
    with them, whatever ran before: a command line ignores them once its run has stopped or
    exported, until it exits (``tfdp.training.preemption.preempt_outside_runs``), and a command
    run here left them ignored for every process the later tests of this worker started (seen in
    whole runs: a launcher started with SIGINT ignored keeps it so, as a shell's background job
    does, and a Ctrl-C typed in its terminal did nothing). Taken from the process's start, not
    from the test's: a module's fixture that ran a command here (a reference run) comes before."""
    def as_the_shell_gave_them():
        for signum, handler in SHELL_SIGNALS.items():
            signal.signal(signum, handler)

    as_the_shell_gave_them()
    yield
    as_the_shell_gave_them()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test that fails leaves none of the processes it started running (a launched cluster
    whose test failed before it waited for it trained on beside the tests after it, on their
    cores): those started in its body and still alive are killed, their tasks with them."""
    from processes import children

    before = set(children(os.getpid()))
    outcome = yield
    if outcome.excinfo is not None:
        for pid in set(children(os.getpid())) - before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session", autouse=True)
def commands_forked_from_one_import():
    """This worker's zygote (tests/zygote.py): the ``python -m tfdp.<command>`` processes
    started under its tests are forked from one that imported TensorFlow once."""
    import zygote

    started = zygote.start(_OWN)
    yield
    if started:
        zygote.stop(started)


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
    shared = shared_temp(tmp_path_factory)
    path = os.environ.get("TFDP_TEST_DATA_DIR") or str(shared / "tfds")
    with only_one_worker(str(shared / "tfds.lock")):  # TFDS' preparation and tfdp's arrays.
        sources.prepare(data_dir=path, manual_dir=manual_dir)
    return path


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory, data_dir):
    """Runs trained once a session, for the tests that only read them (``shared_runs``)."""
    from shared_runs import SharedRuns

    return SharedRuns(tmp_path_factory.mktemp("shared-runs"), data_dir)


@pytest.fixture(scope="session")
def train_split(data_dir):
    return pipeline.load_split("train", data_dir)


@pytest.fixture(scope="session")
def test_split(data_dir):
    return pipeline.load_split("test", data_dir)
