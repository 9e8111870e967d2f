"""tfdp from Python: ``tfdp.run(num_gpus=2, batch_size=256, lr=0.2)`` returns a ``tfdp.Result``.

The keyword arguments are the command line's flags (``python -m tfdp.train --help``), with the
same defaults and the same checks: a bad one raises ``tfdp.UserError`` (a ``ValueError``)
carrying the line the command line prints. ``model`` also takes your model's function itself,
``function(input_shape, num_classes)`` returning a Keras model, or a Keras model instance (its
weights are the run's start; in this process only: not in a cluster); ``dataset`` also takes your
arrays, ``(x_train, y_train, x_test, y_test)`` (uint8 images, integer labels) or a dict of those
names (and ``class_names``), written once to tfdp's array cache under ``data_dir``.

Logical devices are fixed when TensorFlow starts, once per process: a later run in the same
process may use as many devices as the first configured, or fewer. To train on 1 and then 2
devices in one notebook, call ``tfdp.configure_devices(2)`` first (or run the larger one
first); otherwise a run that needs more raises and says to restart the kernel.

In a Slurm step (``srun python script.py``) or a Kubernetes Indexed Job's pod, ``run`` joins
the cluster as ``python -m tfdp.train`` does (docs/clusters.md): every ``multi_worker`` task
trains and returns; on the from-scratch and parameter-server paths the chief returns, and the
other tasks become ``tfdp.server`` (the script goes no further there), which an interactive
session (a notebook, a shell) cannot: refused in one line.
"""

import dataclasses
import os

from tfdp.cluster import managed, tf_config
from tfdp.config import model_spec
from tfdp.config.settings import Config
from tfdp.util import logs
from tfdp.util.errors import UserError

FLAGS = tuple(field.name for field in dataclasses.fields(Config))


def run(**flags):
    """Train as ``python -m tfdp.train --flag=value ...`` does; return its ``Result``."""
    unknown = sorted(set(flags) - set(FLAGS))
    if unknown:
        raise UserError(f"unknown flag(s) {', '.join(unknown)}: tfdp.run takes the flags of "
                        "python -m tfdp.train (see tfdp.training.from_python.FLAGS)")
    if model_spec.is_keras_model(flags.get("model")):  # Your model itself: its weights start.
        flags["model"] = model_spec.spec_of_instance(flags["model"])
    elif callable(flags.get("model")):  # Your model's function itself (docs/your-model.md).
        flags["model"] = model_spec.spec_of(flags["model"])
    if flags.get("dataset") is not None and not isinstance(flags["dataset"], str):
        from tfdp.data import sources  # Your arrays, written to the cache (docs/your-data.md).

        flags["dataset"] = sources.from_arrays(flags["dataset"], flags.get("data_dir"))
    config = Config(**flags)
    logs.configure(config.verbose)
    # In a task of Slurm or Kubernetes: the cluster joined as tfdp.train joins it.
    managed.join(config, caller="tfdp.run")
    if model_spec.is_instance(config.model) and os.environ.get(tf_config.ENV):
        raise UserError("tfdp.run(model=<a Keras model>) in a cluster: the instance is this "
                        "process's alone, and every task must build the same model; give "
                        "tfdp.run the function that builds it (model=function)")
    logs.import_tensorflow()
    from tfdp.training import entry

    return entry.train(config)


def configure_devices(num_devices: int) -> list:
    """Make ``num_devices`` devices (logical ones if there are fewer) before the first run, so
    that later runs in this process may use up to that many."""
    logs.configure(logs.verbose())
    logs.import_tensorflow()
    from tfdp.util import devices

    return devices.configure_devices(num_devices)
