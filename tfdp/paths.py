"""The one way to run a configuration: on the path its ``--strategy`` names
(``tfdp.path_registry``), through the run skeleton (``tfdp.training.skeleton``)."""

import dataclasses

from tfdp import path_registry
from tfdp.config import Config
from tfdp.models import precision
from tfdp.training import skeleton
from tfdp.training.result import Result


def run(config: Config, start_weights=None) -> Result:
    """Train ``config`` on the path its ``--strategy`` names (``tfdp.training.skeleton.run``),
    in the precision this machine resolves ``--precision=auto`` to."""
    if config.precision == "auto":
        config = dataclasses.replace(config, precision=precision.resolve(config.precision))
    return skeleton.run(config, path_registry.get(config.strategy).training_path(),
                        start_weights)
