"""The end of every epoch on every path, written once: evaluate, report (with the clock of
``tfdp.training.clock``), back up, and stop there if the run was asked to (preemption) or has
reached ``--target_accuracy``.

The epoch loop (``tfdp.training.loop``: the from-scratch and parameter-server paths) calls it
after its last step of the epoch is collected; under Keras ``fit`` tfdp's one callback
(``tfdp.paths.keras.callback``) calls it from ``on_epoch_end``. Divergence is each caller's, per
step: a diverged epoch never reaches its end.
"""

from tfdp.cluster.stall import watching
from tfdp.training.report import Trained


class EpochEnd:
    """``evaluate()`` -> (loss, accuracy, confusion matrix) on the split evaluated after every
    epoch, ``evaluate(final=True)`` on the test set once after training (where a validation
    split is the other: ``plan.tested``); the final evaluation's confusion matrix is reported
    (``Reporter.confusion``); ``state()`` the run's training state to
    back up (``tfdp.training.state.TrainingState``); ``figures()`` -> (a path's own figures of
    the epoch for its record, words for its line); ``preempted()`` whether to stop after this
    epoch (default: this process's ``Watch``; across workers, their agreement)."""

    def __init__(self, run, evaluate, state, figures=None, preempted=None):
        self.run, self.evaluate, self.state = run, evaluate, state
        self.figures = figures or (lambda: ({}, ""))
        self.preempted = preempted or (lambda: run.watch.requested)

    def __call__(self, epoch: int, step: int, trained: Trained) -> bool:
        """End ``epoch`` (from 0) after global step ``step``, its training ``trained``. Whether
        training is over: ``--target_accuracy`` reached (the caller stops and the run exports).
        Raises ``Preempted`` after the backup when asked to stop."""
        run = self.run
        with watching(run.stall, f"evaluating epoch {epoch + 1}"):
            test_loss, test_acc, *confusion = self.evaluate()  # And its confusion matrix.
        clock = run.clock.reading()  # Stopped at the evaluation, as MLPerf's run_stop.
        extra, note = self.figures()
        run.reporter.epoch_end(epoch, trained, test_loss, test_acc,
                               extra=dict(extra, clock_s=clock), note=note)
        target = run.config.target_accuracy
        reached = target is not None and test_acc >= target
        if reached:
            # Every worker evaluated the same global accuracy: all stop here, and export.
            run.reached = run.reporter.records[-1]
        last, split = reached or epoch + 1 == run.plan.epochs, run.plan.evaluated
        if run.plan.tested and last:
            with watching(run.stall, "evaluating the test set"):
                loss, accuracy, *confusion = self.evaluate(final=True)
            run.reporter.tested(loss, accuracy, note=run.plan.test_note)
            split = "test"
        if last and confusion:  # Where the final evaluation goes wrong.
            run.reporter.confusion(confusion[0], split)
        # The last backup comes after the final evaluation's figures are in metrics.json: a run
        # stopped before it resumes inside the last epoch and evaluates again; one stopped after
        # it has nothing left to train and keeps them (Reporter.resumed_trained).
        saved = run.back_up(step, self.state)
        if reached:
            return True
        if self.preempted():
            if run.backups:
                run.backups.wait()  # Written before the process ends.
            raise run.watch.preempted(step, saved)
        return False
