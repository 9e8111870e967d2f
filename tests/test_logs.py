"""What a run prints on stderr (tfdp.util.logs): tfdp's lines, warnings, errors and tracebacks, not
the libraries' INFO nor TensorFlow's C++ start-up banners; all of it with --verbose."""

import io
import os
import re
import subprocess
import sys

from conftest import REPO
from tfdp.util import logs

BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env or None)


def test_tensorflow_still_prints_startup_banners_past_its_log_level():
    """The upstream bug logs.import_tensorflow works around (tensorflow/tensorflow#102212,
    abseil/abseil-cpp#1957). When this fails, TensorFlow honours TF_CPP_MIN_LOG_LEVEL from the
    start: delete the fd-2 filter in tfdp/util/logs.py and this test."""
    import os

    result = run_python("import tensorflow as tf; tf.config.list_physical_devices()",
                        **dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-2000:]
    banners = [l for l in result.stderr.splitlines() if logs.STARTUP_BANNERS.match(l)]
    assert any(BANNER in l for l in banners), result.stderr[-2000:]


def test_keras_still_imports_matplotlib_as_it_starts():
    """The upstream behaviour tfdp.util.matplotlib_deferred works around (Keras' visualization
    modules import matplotlib at module level). When this fails, importing TensorFlow no longer
    imports matplotlib: delete tfdp/util/matplotlib_deferred.py, its call in tfdp/util/logs.py and the
    test below."""
    result = run_python("import sys, tensorflow; print('matplotlib.pyplot' in sys.modules)")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True"]


DEFERRED_CHECK = r"""
import gc, sys
from tfdp.util import logs

collections = sum(s["collections"] for s in gc.get_stats())
logs.import_tensorflow()
print("imported with TensorFlow:", "matplotlib" in sys.modules)
print("collections:", sum(s["collections"] for s in gc.get_stats()) - collections,
      "frozen:", gc.get_freeze_count() > 200000, "collector on:", gc.isenabled())
frozen, made_since = gc.get_freeze_count(), [[] for _ in range(1000)]
logs.import_tensorflow()  # A notebook's second run: what it made since stays collectable.
print("frozen again:", gc.get_freeze_count() != frozen)
from tensorflow.python.autograph.core import config
from tensorflow.python.autograph.impl import conversion
from tfdp.data import pipeline

def users(x):
    return x

print("autograph converts tfdp's:", not conversion.is_allowlisted(pipeline.to_float),
      "the user's:", not conversion.is_allowlisted(users),
      "rules for tfdp:", sum(str(r).endswith(" tfdp") for r in config.CONVERSION_RULES))
import keras, numpy as np

keras.visualization.plot_image_gallery(np.zeros((2, 8, 8, 3)), path=sys.argv[1])
print("imported to plot:", "matplotlib.pyplot" in sys.modules)
"""


def test_tensorflow_imports_without_matplotlib_or_the_collector_and_keras_still_plots(tmp_path):
    """tfdp imports matplotlib when something draws (tfdp.util.matplotlib_deferred), and the
    garbage collector neither runs during TensorFlow's import nor walks its objects afterwards,
    and autograph leaves tfdp's functions as written, a user's not (tfdp.util.start_cost). When
    TensorFlow's autograph rules move, the last costs time again and this test fails."""
    gallery = tmp_path / "gallery.png"
    result = subprocess.run([sys.executable, "-c", DEFERRED_CHECK, str(gallery)],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        "imported with TensorFlow: False", "collections: 0 frozen: True collector on: True",
        "frozen again: False", "autograph converts tfdp's: False the user's: True rules for "
        "tfdp: 1", "imported to plot: True"], result.stdout
    assert gallery.stat().st_size > 100


FILTER_CHECK = r"""
import os, traceback
from absl import logging as absl_logging
from tfdp.util import logs

logs.configure(verbose=False)
try:
    with logs._stderr_filtered(logs.STARTUP_BANNERS):
        os.write(2, b"%s\n")
        os.write(2, b"I0000 00:00:1795383548.576454   16187 port.cc:153] oneDNN custom ops\n")
        os.write(2, b"E0000 00:00:1795383565.583418   16203 cuda_platform.cc:52] no cuInit\n")
        os.write(2, b"someone else's line\n")
        raise RuntimeError("boom")
except RuntimeError:
    traceback.print_exc()
logs.import_tensorflow()
logs.logger.info("a tfdp line")
logs.logger.warning("a tfdp warning")
absl_logging.info("a library's info")
absl_logging.warning("a library's warning")
""" % BANNER


def test_only_the_banners_and_library_info_are_hidden():
    result = run_python(FILTER_CHECK)
    assert result.returncode == 0, result.stderr[-2000:]
    err = result.stderr
    assert "InitializeLog" not in err and "port.cc" not in err and "cuInit" not in err, err
    assert "someone else's line" in err and "RuntimeError: boom" in err
    lines = err.splitlines()
    assert "a tfdp line" in lines and "warning: a tfdp warning" in lines
    assert "a library's warning" in err and "a library's info" not in err
    assert not [l for l in lines if re.match(r"[IE]\d{4} ", l)], err


# What a parameter-server chief printed while a killed worker was being restarted (TF 2.21).
GRPC_REPEATS = """\
E0000 00:00:1795596382.212924    7599 context.cc:873] Failed to register function remotely due to failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:60069: Failed to connect to remote host: Connection refused
Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling /tensorflow.eager.EagerService/Enqueue:
:UNKNOWN:Error received from peer  {grpc_message:"failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:60069: Failed to connect to remote host: Connection refused", grpc_status:14}
This could happen if the remote target has been disconnected from the client.
"""


def test_the_launcher_shows_a_repeated_grpc_error_once_and_every_other_line():
    from tfdp.launcher import output

    head = GRPC_REPEATS.replace("register", "remove")
    own = "Traceback (most recent call last):\nThis could happen if the remote target has been " \
          "disconnected from the client.\ntfdp.train: error: lost contact\n"
    raw = "epoch 1/3\n" + GRPC_REPEATS * 3 + head + "epoch 2/3\r" + GRPC_REPEATS + own
    read, write = os.pipe()
    os.write(write, raw.encode())
    os.close(write)
    out = io.StringIO()
    with os.fdopen(read, "rb") as stream:
        output.pump(stream, "[chief] ", out)
    expected = "epoch 1/3\n" + GRPC_REPEATS + "epoch 2/3\r" + own
    assert out.getvalue() == "".join("[chief] " + line for line in expected.splitlines(True))
