"""Workaround: Keras imports ``matplotlib.pyplot`` as it starts, in every process.

Upstream, seen in Keras 3.15: ``keras/src/visualization/plot_image_gallery.py`` runs ``import
matplotlib.pyplot as plt`` at module level (and ``plot_bounding_box_gallery.py`` ``from matplotlib
import patches``), and ``import tensorflow`` imports Keras, so every TensorFlow process that can
import matplotlib does, plotting or not: a sizeable part of importing TensorFlow (measured in
docs/design.md#tests). No upstream issue was found to link.

``deferred()`` hides matplotlib while TensorFlow and Keras import (Keras' own ``except
ImportError`` then leaves those two names ``None``), and afterwards gives them stand-ins that
import matplotlib at their first use: ``keras.visualization`` still plots. matplotlib imported
before (a notebook's ``%matplotlib inline``) is left as it is. ``tests/test_logs.py`` checks
that Keras still imports matplotlib without this (so it is still needed) and that
``keras.visualization`` plots with it.
"""

import contextlib
import importlib
import importlib.util
import sys

# Keras' module-level names bound to matplotlib, and what each names.
_KERAS_NAMES = (("keras.src.visualization.plot_image_gallery", "plt", "matplotlib.pyplot"),
                ("keras.src.visualization.plot_bounding_box_gallery", "patches",
                 "matplotlib.patches"))


@contextlib.contextmanager
def deferred():
    """Import TensorFlow inside this block: matplotlib is imported at its first use instead."""
    if "matplotlib" in sys.modules or importlib.util.find_spec("matplotlib") is None:
        yield
        return
    sys.modules["matplotlib"] = None  # ``import matplotlib...`` raises ImportError.
    try:
        yield
    finally:
        if sys.modules.get("matplotlib", False) is None:
            del sys.modules["matplotlib"]
        for module_name, name, target in _KERAS_NAMES:
            module = sys.modules.get(module_name)
            if module is not None and getattr(module, name, False) is None:
                setattr(module, name, _ImportedAtFirstUse(target))


class _ImportedAtFirstUse:
    """Module ``name``, imported when an attribute of it is first read."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute):
        return getattr(importlib.import_module(self._name), attribute)
