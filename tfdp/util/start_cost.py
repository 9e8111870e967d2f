"""Python's cyclic garbage collector kept off TensorFlow's modules: a smaller start, faster steps.

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
"""

import contextlib
import gc


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
