"""The training paths, and what every path does before and after it trains.

A path is a module with ``run(config, start_weights=None) -> tfdp.Result``. It sets up what
runs its replicas (devices, or a ``tf.distribute`` strategy), then::

    run = paths.start(config, devices, replicas, engine="...")    # data, plan, reporter
    ...train by run.plan on run.train_split, report to run.reporter...
    return paths.finish(run, weights, export=lambda: ...)          # final line, export

``start_weights`` (LeNet weights in Keras order) replace ``--init``: tests start paths from
equal weights to compare them.
"""

import dataclasses
import importlib

from tfdp import cluster, workdir
from tfdp.config import Config, with_run_dir
from tfdp.errors import UserError
from tfdp.logs import logger
from tfdp.result import Result

PATHS = {
    "manual": "tfdp.manual.trainer",
    "mirrored": "tfdp.keras_path.trainer",
    "multi_worker": "tfdp.keras_path.trainer",
    "plain": "tfdp.keras_path.trainer",
    "parameter_server": "tfdp.parameter_server.trainer",
}


def run(config: Config, start_weights=None) -> Result:
    """Run one validated configuration on its path (``--strategy``), holding its run folder."""
    config = with_run_dir(config)
    worker = cluster.task().worker_index if config.strategy == "multi_worker" else 0
    with workdir.claim(config.run_dir, worker):
        return importlib.import_module(PATHS[config.strategy]).run(config, start_weights)


@dataclasses.dataclass
class Started:
    config: Config
    plan: object
    train_split: object
    test_split: object
    reporter: object
    devices: list


def start(config: Config, devices: list, replicas: int, engine: str, is_chief: bool = True,
          first_step: int = 0, examples: tuple = None) -> Started:
    """Check the export folder (chief), load the data, make and state the plan, open the
    reporter (with the epochs an interrupted run already finished, when resuming from
    ``first_step``). With ``examples`` (train, test sizes), the data is elsewhere (on a
    cluster's workers) and nothing is loaded here."""
    from tfdp import data, export, report
    from tfdp.devices import native_bfloat16
    from tfdp.plan import make_plan

    if is_chief:
        export.check_export_root(config.export_root)
    if examples:
        train_split = test_split = None
    else:
        train_split, test_split = data.load_splits(config.data_dir, config.manual_dir,
                                                   config.synthetic_data)
        examples = len(train_split.labels), len(test_split.labels)
    plan = make_plan(config, replicas, *examples)
    logger.info("%s", plan.describe(engine))
    if "bfloat16" in (config.precision, config.allreduce_dtype) and not native_bfloat16():
        logger.warning("this machine has no native bfloat16 arithmetic (no avx512_bf16, "
                       "amx_bf16 or a GPU of compute capability 8.0+): bfloat16 will be slower "
                       "than float32 here, not wrong")
    first_epoch, offset = divmod(first_step, plan.steps_per_epoch)
    if first_step and is_chief:
        print(f"resuming at epoch {first_epoch + 1}/{config.epochs}, step "
              f"{offset}/{plan.steps_per_epoch} (global step {first_step})"
              if first_epoch < config.epochs else
              f"resuming a run that finished training ({first_step} steps): exporting it",
              flush=True)
    history = report.load_history(config.run_dir, first_epoch) if is_chief and first_epoch else ()
    reporter = report.Reporter(config.run_dir, plan.facts(config), devices, is_chief,
                               history=history, eval_note=plan.eval_note)
    return Started(config, plan, train_split, test_split, reporter, list(devices))


def finish(run: Started, weights: list, export, backups=None) -> Result:
    """Print the final line, export (``export()`` returns the version's path, or None off the
    chief) and return the run's ``Result``. An export that cannot be written is a one-line
    error; the last backup keeps the trained weights for the same command to export."""
    import tensorflow as tf

    line = run.reporter.final_line()
    try:
        path = export()
    except (OSError, tf.errors.OpError) as e:
        reason = _reason(e)
        kept = f"the trained weights are kept in {backups.folder}; " if backups else ""
        raise UserError(f"cannot write the export under {run.config.export_root} ({reason}): "
                        f"{kept}make room and run the same command again to export") from None
    run.reporter.record_export(path)
    if path:
        print(f"exported {path}", flush=True)
    records = run.reporter.records
    return Result(test_accuracy=records[-1]["test_acc"] if records else float("nan"),
                  sec_per_epoch=run.reporter.sec_per_epoch() if records else float("nan"),
                  history=[dict(r) for r in records], export_path=path,
                  devices=run.reporter.devices, run_dir=run.config.run_dir, final_line=line,
                  plan=run.plan, weights=weights)


def _reason(error) -> str:
    """What went wrong, in a few words: TensorFlow's messages carry function and file names."""
    text = getattr(error, "strerror", None) or str(getattr(error, "message", error))
    for known in ("No space left on device", "Permission denied", "Read-only file system",
                  "Disk quota exceeded"):
        if known in text:
            return known
    return text.splitlines()[0][:200] if text else type(error).__name__
