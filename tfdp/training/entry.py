"""The one entry that trains: ``train(config)`` runs a configuration on the path its
``--strategy`` names (``tfdp.paths``), through the run lifecycle
(``tfdp.training.lifecycle``), and returns its ``Result``. ``python -m tfdp.train``, ``tfdp.run``,
the tests and the bench all train through it; the last two may hand it data already loaded and
leave the export out."""

import dataclasses

from tfdp import paths
from tfdp.config.settings import Config
from tfdp.models import precision
from tfdp.training import lifecycle
from tfdp.training.result import Result


def train(config: Config, start_weights=None, splits=None, export: bool = True) -> Result:
    """Train ``config`` in the precision this machine resolves ``--precision=auto`` to.
    ``start_weights`` (Keras order) replace ``--init``; ``splits``, ``(train, test)``
    ``tfdp.data.pipeline.Split``s, replace the dataset the config names; without ``export`` nothing is
    written under ``--export_dir`` (the run folder is written as always)."""
    if config.precision == "auto":
        config = dataclasses.replace(config, precision=precision.resolve(config.precision))
    return lifecycle.run(config, paths.get(config.strategy).training_path(),
                        start_weights, splits, export)
