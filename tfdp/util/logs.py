"""What a run prints on stderr: tfdp's own lines, warnings and errors; the rest on ``--verbose``.

tfdp logs through the Python logger ``tfdp`` (plain lines, ``warning: ...`` for warnings).
TensorFlow, TFDS and absl speak INFO through the ``absl`` and ``tensorflow`` loggers (saver
chatter, "Writing fingerprint", dataset reader lines) and TFDS draws tqdm bars while it prepares
the data: without ``--verbose`` those stay at WARNING and the bars are off (tfdp says itself
when it prepares the data). Nothing at WARNING or above is hidden, except TFDS' warnings about
the folder it is writing while it prepares the data, and Python tracebacks are printed by
Python, untouched.

TensorFlow's C++ log (``TF_CPP_MIN_LOG_LEVEL``) shows only FATAL without ``--verbose``: its
errors and warnings (a lost peer's gRPC status, a collective's abort, a full disk) repeat what
the Python exception carries, which tfdp turns into its one line, and arrived as a wall of lines
before it. A ``TF_CPP_MIN_LOG_LEVEL`` set by the user is kept. The C++ start-up banners print
before that threshold applies: see :func:`import_tensorflow`.
"""

import contextlib
import io
import logging
import os
import re
import sys
import tempfile

from absl import logging as absl_logging

logger = logging.getLogger("tfdp")
logger.setLevel(logging.INFO)  # tfdp's own lines are INFO; shown unless a caller says otherwise.

_verbose = False

# Lines TensorFlow 2.21's C++ runtime writes to fd 2 while it is imported and first lists its
# devices, before absl::InitializeLog() is called, so TF_CPP_MIN_LOG_LEVEL cannot hide them
# (they come twice: two shared libraries each carry a copy of absl's logger).
# Upstream: https://github.com/tensorflow/tensorflow/pull/102212 (call InitializeLog first) and
# https://github.com/abseil/abseil-cpp/pull/1957 (honour the threshold before it).
# tests/test_logs.py notices when TensorFlow stops printing them.
STARTUP_BANNERS = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IWE]\d{4} [\d:.]+ +\d+ (port\.cc|cudart_stub\.cc|cpu_feature_guard\.cc|cuda_executor\.cc"
    r"|cuda_platform\.cc|cuda_dnn\.cc|cuda_fft\.cc|cuda_blas\.cc)[:\]]"
    r"|To enable the following instructions: .* in other operations, rebuild TensorFlow")


class _ToCurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (a notebook or a test may replace it)."""

    stream = property(lambda self: sys.stderr, lambda self, value: None)


class _Lines(logging.Formatter):
    def format(self, record):
        message = super().format(record)
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {message}"
        return message


def configure(verbose: bool) -> None:
    """Route tfdp's lines to stderr and quieten the libraries' INFO (idempotent)."""
    global _verbose
    _verbose = verbose
    if not any(isinstance(h, _ToCurrentStderr) for h in logger.handlers):
        handler = _ToCurrentStderr()
        handler.setFormatter(_Lines())
        logger.addHandler(handler)
    logger.propagate = False  # Not twice through absl's root handler.
    library_level = logging.INFO if verbose else logging.WARNING
    # Through absl's verbosity, not the "absl" logger's level: TensorFlow saves and restores
    # that verbosity around every SavedModel write (autotrackable.py), which resets the level.
    absl_logging.set_verbosity("info" if verbose else "warning")
    for name in ("tensorflow", "tensorflow_datasets", "keras"):
        logging.getLogger(name).setLevel(library_level)
    for name in ("matplotlib", "h5py"):  # Font searches and converters, even with --verbose.
        logging.getLogger(name).setLevel(logging.WARNING)
    if not verbose and not os.environ.get("TF_CPP_MIN_LOG_LEVEL"):
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # C++ FATAL only: read when TF is imported.


@contextlib.contextmanager
def quiet_below(level, *names):
    """Raise the named loggers to ``level`` for a block, unless ``--verbose``."""
    if verbose():
        yield
        return
    loggers = [logging.getLogger(name) for name in names]
    saved = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(level)
    try:
        yield
    finally:
        for log, old in zip(loggers, saved):
            log.setLevel(old)


def quiet_from_now_on(*names) -> None:
    """Raise the named loggers above ERROR for the rest of the process, unless ``--verbose``:
    for what a library's own threads would still log about a failure tfdp has just summed up
    in its one line (a ClusterCoordinator's closures, each in a thread of its own, log a lost
    parameter server after the main thread has heard of it)."""
    if not verbose():
        for name in names:
            logging.getLogger(name).setLevel(logging.CRITICAL)


def stdout_dropped_unless_verbose():
    """Drop what a library prints on stdout in this block (tfdp's stdout is its results)."""
    return contextlib.nullcontext() if verbose() else contextlib.redirect_stdout(io.StringIO())


def verbose() -> bool:
    return _verbose


def import_tensorflow():
    """Import TensorFlow and list its devices, dropping only the known C++ start-up banners.

    While TensorFlow starts, fd 2 goes to a temporary file; afterwards every line that is not one
    of ``STARTUP_BANNERS`` is written back to stderr, in order, whether the import succeeded or
    raised. With ``--verbose`` nothing is captured. Keras' matplotlib is imported at its first
    use (``tfdp.util.matplotlib_deferred``); Python's cyclic garbage collector waits for the
    first import to end (``tfdp.util.start_cost``; later calls, a notebook's second run, freeze
    nothing more), and autograph leaves tfdp's own functions as written (the same module). The
    threads the import starts never take SIGTERM (``tfdp.util.main_thread``).
    """
    from tfdp.util import main_thread, matplotlib_deferred, start_cost

    started = "tensorflow" in sys.modules
    with main_thread.main_thread_only(), (
            contextlib.nullcontext() if verbose() or started
            else _stderr_filtered(STARTUP_BANNERS)):
        with matplotlib_deferred.deferred():
            with contextlib.nullcontext() if started else start_cost.collector_paused():
                import tensorflow as tf

        tf.config.list_physical_devices()  # The CUDA probe logs here, on first use.
    start_cost.tfdp_code_as_written()
    return tf


def known_lines_dropped(pattern):
    """Drop the lines matching ``pattern`` that C++ code writes to fd 2 in this block (unless
    ``--verbose``): known, harmless chatter that no threshold hides."""
    return contextlib.nullcontext() if verbose() else _stderr_filtered(pattern)


@contextlib.contextmanager
def _stderr_filtered(pattern):
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # No fd 2 (e.g. some notebook kernels): nothing to filter.
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(True)
                    if not pattern.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()

