"""The one entry that trains: ``train(config)`` resolves the run once (``resolve``: the
machine's precision, the run folder, its path, this process's place in a cluster), then runs it
on its path through the run's lifecycle (``tfdp.training.lifecycle``) and returns its ``Result``.
``python -m tfdp.train``, ``tfdp.run``, the tests and the bench all train through it; the last two
may hand it data already loaded and leave the export out."""

import dataclasses

from tfdp import paths
from tfdp.cluster import tf_config
from tfdp.config.settings import Config
from tfdp.models import precision
from tfdp.training import lifecycle, run_folder
from tfdp.training.result import Result


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
    """A run as the entry resolves it, once, before anything starts; every later stage reads it
    and none rebuilds it. ``config``: the flags with ``--precision=auto``, the run folder and
    ``--plots`` chosen; ``path``: its ``--strategy``'s description; ``worker``: whose lock and
    backups this process holds (its task's index where every task trains a replica, else 0);
    ``folder_named``: whether ``--workdir`` named the folder (else a new one was chosen)."""
    config: Config
    path: paths.Path
    worker: int
    folder_named: bool


def resolve(config: Config) -> ResolvedRun:
    """``config`` resolved on this machine and in this process's cluster."""
    path = paths.get(config.strategy)
    every_task_trains = path.cluster == paths.WORKERS
    chosen = {}
    if config.precision == "auto":
        chosen["precision"] = precision.resolve(config.precision)
    if config.plots is None:
        chosen["plots"] = config.plots_or_default()
    if config.workdir is None:
        chosen["workdir"] = run_folder.new_folder(config, every_task_trains)
    return ResolvedRun(dataclasses.replace(config, **chosen) if chosen else config, path,
                       tf_config.task().worker_index if every_task_trains else 0,
                       folder_named=config.workdir is not None)


def train(config: Config, start_weights=None, splits=None, export: bool = True) -> Result:
    """Train ``config`` (resolved here: ``resolve``). ``start_weights`` (Keras order) replace
    ``--init``; ``splits``, ``(train, test)`` ``tfdp.data.pipeline.Split``s, replace the dataset
    the config names; without ``export`` nothing is written under ``--export_dir`` (the run
    folder is written as always)."""
    return lifecycle.run(resolve(config), start_weights, splits, export)
