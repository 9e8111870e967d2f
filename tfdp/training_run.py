"""The one entry that trains: ``train(config)`` runs a configuration on the path its
``--strategy`` names (``tfdp.path_registry``), through the run skeleton
(``tfdp.training.skeleton``), and returns its ``Result``. ``python -m tfdp.train``, ``tfdp.run``,
the tests and the bench all train through it; the last two may hand it data already loaded and
leave the export out."""

import dataclasses

from tfdp import path_registry
from tfdp.config import Config
from tfdp.models import precision
from tfdp.training import skeleton
from tfdp.training.result import Result


def train(config: Config, start_weights=None, splits=None, export: bool = True) -> Result:
    """Train ``config`` in the precision this machine resolves ``--precision=auto`` to.
    ``start_weights`` (Keras order) replace ``--init``; ``splits``, ``(train, test)``
    ``tfdp.data.Split``s, replace the dataset the config names; without ``export`` nothing is
    written under ``--export_dir`` (the run folder is written as always)."""
    if config.precision == "auto":
        config = dataclasses.replace(config, precision=precision.resolve(config.precision))
    return skeleton.run(config, path_registry.get(config.strategy).training_path(),
                        start_weights, splits, export)
