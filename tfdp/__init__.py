"""tfdp: data-parallel training of image classifiers with TensorFlow 2 and Keras 3.

    import tfdp
    result = tfdp.run(num_gpus=2, batch_size=256, lr=0.2)   # the flags of python -m tfdp.train
    result.test_accuracy, result.sec_per_epoch, result.export_path
    result.plot()                                            # accuracy and loss per epoch

Every path has the same entry, ``tfdp.training.entry.train(config) -> Result``, and declares
what it is in ``tfdp.paths``:

* ``tfdp.paths.manual``: the textbook algorithm written out (replicate, split, one tape per device,
  allreduce, the same update everywhere);
* ``tfdp.paths.keras``: Keras ``fit`` under ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy``;
* ``tfdp.paths.parameter_server``: asynchronous SGD on parameter servers.
"""

import importlib

from tfdp.util.errors import Diverged, Finished, Preempted, UserError

__version__ = "0.1.0"
__all__ = ["run", "configure_devices", "Result", "UserError", "Diverged", "Preempted",
           "Finished"]
# Imported when first asked for: ``python -m tfdp.train`` imports this package before its own
# first line, and a Ctrl-C while it imported more came out as a traceback.
_LATER = {"run": "tfdp.training.from_python", "configure_devices": "tfdp.training.from_python",
          "Result": "tfdp.training.result"}


def __getattr__(name):
    if name in _LATER:
        return getattr(importlib.import_module(_LATER[name]), name)
    raise AttributeError(f"module 'tfdp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
