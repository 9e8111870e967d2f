"""Every training path, registered by the ``--strategy`` values that choose it, and the one way
to run a configuration on its path.

``PATHS`` maps each strategy to its ``TrainingPath`` subclass (``tfdp.training.training_path``);
``run(config)`` hands the configuration and its path to the run skeleton.
"""

import dataclasses

from tfdp.config import Config
from tfdp.keras_path.trainer import KerasFitPath
from tfdp.manual.trainer import FromScratchPath
from tfdp.models import precision
from tfdp.parameter_server.trainer import ParameterServerPath
from tfdp.training import skeleton
from tfdp.training.result import Result

PATHS = {
    "manual": FromScratchPath,
    "mirrored": KerasFitPath,
    "multi_worker": KerasFitPath,
    "plain": KerasFitPath,
    "parameter_server": ParameterServerPath,
}


def run(config: Config, start_weights=None) -> Result:
    """Train ``config`` on the path its ``--strategy`` names (``tfdp.training.skeleton.run``),
    in the precision this machine resolves ``--precision=auto`` to."""
    if config.precision == "auto":
        config = dataclasses.replace(config, precision=precision.resolve(config.precision))
    return skeleton.run(config, PATHS[config.strategy], start_weights)
