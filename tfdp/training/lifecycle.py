"""A run's life, what every path does around its training, written once.

``run(resolved)`` (a ``tfdp.training.entry.ResolvedRun``) holds the run folder, sets the path up
(the ``tfdp.training.path_contract.TrainingPath`` its description names), resumes, states the
plan, trains, exports and returns the ``Result``::

    path = Path(resolved, backups)        # devices or a strategy, replicas, chief, peers, data
    first_step = resume_step(backups)     # the newest step every worker backed up, or 0
    run = start(resolved, path, ...)      # data, plan, reporter
    weights = path.train(run, state)      # the path's own training (the epoch loop, or fit)
    finish(run, weights, path.export)     # final line, export (written once), Result
"""

import dataclasses
from typing import Optional

from tfdp.cluster import tf_config
from tfdp.config import recipes
from tfdp.config.settings import Config
from tfdp.trace.tracer import Tracer
from tfdp.training import preemption, report, run_folder
from tfdp.training.backups import Backups, identity, resume_step
from tfdp.training.backup_interval import BackupInterval
from tfdp.training.clock import Clock
from tfdp.training.path_contract import TrainingPath
from tfdp.training.result import Result
from tfdp.training.state import TrainingState
from tfdp.util import errors, logs
from tfdp.util.errors import LostContact, UserError
from tfdp.util.logs import logger


@dataclasses.dataclass
class Run:
    """A started run: what the path's training reads and reports to."""
    config: Config
    plan: object
    reporter: object
    devices: list
    first_step: int = 0
    backups: Optional[Backups] = None
    watch: preemption.Watch = dataclasses.field(default_factory=preemption.Watch)
    stall: object = None
    train_split: object = None   # None where the data lives on a cluster's workers
    eval_split: object = None    # evaluated after every epoch (validation, or test)
    test_split: object = None    # evaluated once after training, where validation is the above
    tracer: Tracer = dataclasses.field(default_factory=lambda: Tracer(None, ""))
    clock: Clock = dataclasses.field(default_factory=Clock)
    reached: Optional[dict] = None  # The record of the epoch that reached --target_accuracy.
    dataset: object = None  # The data's DatasetInfo (tfdp.data.sources)
    backup_interval: BackupInterval = dataclasses.field(default_factory=lambda: BackupInterval("0"))

    def back_up(self, step: int, state) -> Optional[str]:
        """The backup of ``step`` (``state()``, a ``TrainingState``) written behind training
        (``Backups.save_behind``), at an epoch's end or within one when ``backup_interval``
        finds one due; its path (None without backups)."""
        self.backup_interval.saved(step)
        return self.backups.save_behind(step, state()) if self.backups else None

    @property
    def first_epoch(self) -> int:
        """The epoch (from 0) training starts or resumes in."""
        return self.first_step // self.plan.steps_per_epoch

    @property
    def offset(self) -> int:
        """Steps of ``first_epoch`` already trained before a resume (0 on a fresh start)."""
        return self.first_step % self.plan.steps_per_epoch

    @property
    def trained(self) -> bool:
        """Whether the run resumed after its last step, or after the epoch that reached
        ``--target_accuracy``: nothing is left to train."""
        return self.reached is not None or self.first_epoch >= self.plan.epochs


def run(resolved, start_weights=None, splits=None, export: bool = True) -> Result:
    """Run one resolved configuration (``tfdp.training.entry.ResolvedRun``) on its path,
    holding its run folder. ``start_weights`` (Keras order) replace ``--init``: tests start
    paths from equal weights to compare them; ``splits`` (train, test) replace the data the
    config names (where the path does not keep it on a cluster's workers); without ``export``
    the run ends with no version written. A run given the folder of an interrupted one resumes
    from its newest backup every worker has intact."""
    from tfdp.cluster.stall import PEER_LOST

    config, worker = resolved.config, resolved.worker  # Each task that trains keeps backups.
    with run_folder.claim(config.workdir, worker), \
            errors.naming_the_run(None if resolved.folder_named else config.workdir):
        backups = Backups(config.workdir, worker, identity(config))
        with preemption.Watch() as watch:
            path = resolved.path.training_path()(resolved, backups)
            watch.install()  # The path's set-up may have created TensorFlow's own handler.
            watch.workers = path.num_workers
            watch.peers, watch.backups = bool(path.peers), backups  # preemption.STOP_WITHIN
            try:
                first_step = resume_step(backups, gather=path.gather_steps)
            finally:
                path.started()  # Every worker has answered (or this one gave up).
            watch.reached(first_step)
            watch.check()  # Signals wait for the ends of stages: see preemption.Watch.
            started = start(resolved, path, first_step, backups, watch, splits, export)
            watch.check()
            state = (backups.load(first_step) if first_step else
                     TrainingState(start_weights) if start_weights is not None else None)
            try:
                try:
                    weights = path.train(started, state)
                finally:
                    started.reporter.close_progress()  # What ends a run speaks on its own line.
                result = finish(started, weights,
                                (lambda: path.export(config)) if export else lambda: None,
                                backups)
            except PEER_LOST as e:
                if not path.peers:
                    raise
                logs.quiet_from_now_on("tensorflow")  # The one line below says it all.
                why = type(e).__name__
                raise LostContact(tf_config.lost_contact(why, path.peers, str(e.message),
                                                         backups.steps())
                                  + (path.recorder.recorded(why) if path.recorder else "")
                                  ) from None
            backups.clear()  # Signals are ignored by now (finish): the run is complete.
    return result


def start(resolved, path: TrainingPath, first_step: int = 0, backups: Backups = None,
          watch: preemption.Watch = None, splits=None, export: bool = True) -> Run:
    """``resolved``'s run (``tfdp.training.entry.ResolvedRun``) started on ``path``: check the
    export folder (chief, when the run exports), load the data (unless it lives on the
    cluster's workers, or ``splits`` hold it already), make and state the plan, open the
    reporter (with the epochs an interrupted run already finished, when resuming from
    ``first_step``)."""
    from tfdp.config import dataset_spec
    from tfdp.config.plan import make_plan
    from tfdp.data import pipeline, sources
    from tfdp.export import saved_model
    from tfdp.util.devices import bfloat16_speed

    config = resolved.config
    if path.is_chief and export:
        saved_model.check_export_root(config.export_root)
    clock = Clock()
    clock.start()  # Before the data is read: time to accuracy counts it (tfdp.training.clock).
    train_split = eval_split = test_split = None
    dataset = path.dataset
    if config.dataset != dataset_spec.DEFAULT or dataset.validation:
        logger.info("%s", sources.describe(dataset))
    examples = path.examples
    tested = dataset.examples["test"] if dataset.tested and not splits else 0
    if not examples:
        train_split, eval_split = splits or pipeline.load_splits(dataset, config.synthetic_data)
        examples = len(train_split.labels), len(eval_split.labels)
        if tested:
            test_split = pipeline.load(dataset, dataset.tested, config.synthetic_data)
    plan = make_plan(config, path.replicas, *examples, dataset.evaluated, tested)
    logger.info("%s", plan.describe(path.engine))
    changed = recipes.changed(config)
    if changed:
        logger.info("--recipe=%s on --strategy=%s changes %s: %s (docs/time-to-accuracy.md)",
                    config.recipe, config.strategy, ", ".join(changed),
                    resolved.path.recipe_note)
    if "bfloat16" in (config.precision, config.allreduce_dtype):
        speed = bfloat16_speed()
        if speed < 1:
            logger.warning("this machine multiplies matrices in bfloat16 at %.2fx float32's "
                           "speed (measured once, cached): bfloat16 will be slower than "
                           "float32 here, not wrong", speed)
    tracer = Tracer(config.traced_steps, config.workdir, path.worker_index, path.num_workers,
                    servers=path.servers_traced)
    started = Run(config, plan, None, list(path.devices), first_step, backups,
                  watch or preemption.Watch(), path.stall, train_split, eval_split, test_split,
                  tracer, clock, dataset=dataset,
                  backup_interval=BackupInterval(config.backup_every, first_step))
    first_epoch, offset = started.first_epoch, started.offset
    # Every worker reads the earlier epochs (one folder for all): whether one reached the
    # target before an interruption (an export that failed, say) decides for all.
    earlier = report.load_history(config.workdir, first_epoch) if first_epoch else []
    target = config.target_accuracy
    if earlier and target is not None and earlier[-1]["test_acc"] >= target:
        started.reached = earlier[-1]
    clock.offset = earlier[-1].get("clock_s", 0.0) if earlier else 0.0
    if first_step and path.is_chief:
        print(f"resuming at epoch {first_epoch + 1}/{config.epochs}, step "
              f"{offset}/{plan.steps_per_epoch} (global step {first_step})"
              if not started.trained else
              f"resuming a run that finished training ({first_step} steps): exporting it",
              flush=True)
    started.reporter = report.Reporter(config.workdir, plan.facts(config), path.devices,
                                       path.is_chief, history=earlier if path.is_chief else (),
                                       eval_note=plan.eval_note, evaluated=plan.evaluated)
    started.reporter.add_facts(startup_s=clock.startup, resumed=bool(first_step),
                               class_names=list(dataset.class_names))
    if started.trained:  # Evaluated before the interruption: the test set's figures are kept.
        started.reporter.resumed_trained(report.load_final(config.workdir), plan.test_note)
    return started


def finish(run: Run, weights: list, export, backups: Backups = None) -> Result:
    """Print the final line, export (``export()`` returns the version's path, or None off the
    chief), record it in ``metrics.json`` (a rerun finds the run finished) and return the run's
    ``Result``; a signal from then on is ignored. An export that cannot be written is a
    one-line error; the last backup keeps the trained weights for the same command to
    export."""
    import tensorflow as tf

    from tfdp.cluster.stall import PEER_LOST

    line = run.reporter.final_line()
    run.reporter.draw_chart()
    target = run.config.target_accuracy
    if target is not None:
        run.reporter.add_facts(target_accuracy=target,
                               reached_at_epoch=run.reached["epoch"] if run.reached else None)
        if run.reporter.is_chief:
            print(_target_line(run, target), flush=True)
    run.watch.check()  # The last backup holds the trained state: nothing new to save.
    try:
        version = export()
    except PEER_LOST:
        raise  # A peer lost while the workers save together: lost contact, not the disk.
    except (OSError, tf.errors.OpError) as e:
        reason = _reason(e)
        kept = f"the trained weights are kept in {backups.folder}; " if backups else ""
        raise UserError(f"cannot write the export under {run.config.export_root} ({reason}): "
                        f"{kept}make room and {errors.rerun()} to export") from None
    run.watch.finished()
    run.reporter.record_export(version)
    if version:
        print(f"exported {version}", flush=True)
        _mistakes(run, version)
    records = run.reporter.records
    last = records[-1]["test_acc"] if records else float("nan")
    validated = run.plan.evaluated == "validation"
    tested = run.reporter.facts.get("test", {}).get("acc", float("nan"))
    return Result(test_accuracy=tested if validated else last,
                  validation_accuracy=last if validated else None,
                  sec_per_epoch=run.reporter.sec_per_epoch() if records else float("nan"),
                  history=[dict(r) for r in records], export_path=version,
                  devices=run.reporter.devices, run_dir=run.config.workdir, final_line=line,
                  plan=run.plan, weights=weights)


def _mistakes(run: Run, version: str) -> None:
    """The examples of the final evaluation (``--eval_steps`` may cap it) through the export
    just written: their most confident mistakes reported (``tfdp.training.mistakes``). Not
    for synthetic data (random labels)."""
    from tfdp.data import pipeline
    from tfdp.export.served import Exported
    from tfdp.training import mistakes

    if run.config.synthetic_data or not run.reporter.is_chief:
        return
    plan = run.plan
    split, evaluated = ("test", plan.test_examples) if plan.tested else (plan.evaluated,
                                                                          plan.eval_examples)
    data = run.test_split if plan.tested else run.eval_split
    try:
        data = data or pipeline.load(run.dataset, split)  # Where a cluster's workers read it.
    except (OSError, ValueError) as e:  # A client on a machine without the data: no grid.
        logger.warning("no %s: the %s split is not readable here (%s)", mistakes.FILE, split,
                       e)
        return
    exported = Exported(version)
    found = mistakes.find(exported.probabilities, data.images[:evaluated],
                          data.labels[:evaluated], exported.class_names)
    run.reporter.mistakes(found, data.images, split)


def _target_line(run: Run, target: float) -> str:
    """Whether the run reached ``target``, and on the clock when (tfdp.training.clock)."""
    note, split = run.plan.eval_note, run.plan.evaluated
    if run.reached:
        r = run.reached
        return (f"reached {target:g} {split} accuracy{note} in {r.get('clock_s', 0.0):.1f} s "
                f"(epoch {r['epoch']}: {r['test_acc']:.4f})")
    records = run.reporter.records
    best = max(records, key=lambda r: r["test_acc"]) if records else None
    return (f"did not reach {target:g} {split} accuracy{note}"
            + (f": the best was {best['test_acc']:.4f} (epoch {best['epoch']}), "
               f"{records[-1].get('clock_s', 0.0):.1f} s on the clock" if best else ""))


def _reason(error) -> str:
    """What went wrong, in a few words: TensorFlow's messages carry function and file names."""
    text = getattr(error, "strerror", None) or str(getattr(error, "message", error))
    for known in ("No space left on device", "Permission denied", "Read-only file system",
                  "Disk quota exceeded"):
        if known in text:
            return known
    return text.splitlines()[0][:200] if text else type(error).__name__
