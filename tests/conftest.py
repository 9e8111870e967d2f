"""Shared test set-up: four logical CPU devices per test process, the real data, prepared
once per session from the Fashion-MNIST files (``$TFDP_MANUAL_DIR`` or the shared folder), and
the markers. The helpers tests share live beside it, each module one kind: ``processes`` (a
child's environment, launched clusters, faults from outside), ``same_model`` (runs to compare),
``terminal`` (a real pseudo-terminal), ``exports`` (serving clients), ``traces``,
``slurm_cluster`` (a real Slurm on emulated hosts) and ``shared_runs`` (small runs trained once a
session for the tests that only read them).

Set ``TFDP_TEST_DATA_DIR`` to keep the prepared TFDS data between sessions (.ci/run does).

Markers (setup.cfg): ``slow`` (a long single-process run), ``cluster`` (several processes: the
launcher, tfdp.server), ``root(why)`` (Linux and root: namespaces, mounts; skipped elsewhere,
saying why). The quick tier is ``-m "not slow and not cluster and not root"``.
"""

import atexit
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The suite's measurements (bfloat16's speed, made under the suite's own load) go to a cache of
# its own, inherited by every process it starts, never into the user's ~/.cache.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="tfdp-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)

import pytest  # noqa: E402

from tfdp import data, devices, fashion_mnist  # noqa: E402

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
def shared_runs(tmp_path_factory, data_dir):
    """Runs trained once a session, for the tests that only read them (``shared_runs``)."""
    from shared_runs import SharedRuns

    return SharedRuns(tmp_path_factory.mktemp("shared-runs"), data_dir)


@pytest.fixture(scope="session")
def train_split(data_dir):
    return data.load_split("train", data_dir)


@pytest.fixture(scope="session")
def test_split(data_dir):
    return data.load_split("test", data_dir)
