"""What a run pays before it trains, kept small: Python's cyclic garbage collector kept off
TensorFlow's modules, and autograph kept off tfdp's own functions.

Importing TensorFlow and Keras makes some 440,000 Python objects that the collector tracks, and
that live as long as the process (modules, functions, op definitions, API tables). CPython's
collector runs whenever allocations outnumber deallocations by its threshold, and every so often
walks every object it tracks: during the import those walks free nothing, and later, while a run
traces its steps, each full walk goes through all of TensorFlow's again. ``collector_paused()``
turns the collector off for the import and then moves everything the process holds to the permanent
generation (``gc.freeze()``), which the collector never walks; it is on again afterwards for what
the run makes. What it costs: cyclic garbage already made when TensorFlow is first imported (a
notebook's cells before tfdp's first run) is not collected until ``gc.unfreeze()``; what is made
later is (``tfdp.util.logs.import_tensorflow`` freezes at the first import only). Measured in
docs/design.md#tests.

Autograph rewrites every Python function a ``tf.function`` or a ``tf.data`` map calls unless its
module is on its list of those to leave as written (TensorFlow's, Keras', NumPy's:
``CONVERSION_RULES``): each of tfdp's data functions, losses and Keras-path helpers was converted
in every process that traced them, tens of milliseconds each. tfdp's graph code has no Python
control flow on tensors to convert (the from-scratch steps are compiled with ``autograph=False``
already), so ``tfdp_code_as_written()`` puts tfdp on that list; a model of the user's is still
converted as before. A TensorFlow without that list (a private module) costs the time, nothing
else; ``tests/test_logs.py`` notices.
"""

import contextlib
import gc

_PACKAGE = __name__.split(".")[0]


@contextlib.contextmanager
def collector_paused():
    """Import TensorFlow inside this block: no collection runs in it, and what it made is frozen."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def tfdp_code_as_written():
    """Autograph leaves tfdp's modules as written (above), TensorFlow imported; a second call
    changes nothing."""
    try:
        from tensorflow.python.autograph.core import config
    except ImportError:
        return
    rule = config.DoNotConvert(_PACKAGE)
    if not any(str(r) == str(rule) for r in config.CONVERSION_RULES):
        config.CONVERSION_RULES = (rule, *config.CONVERSION_RULES)
