"""After a loss, the step a survivor holds whole: backed up where the group is better off going
on from it than from the newest backup, on every path whose workers hold the run's state (the
from-scratch client's surviving replicas, each ``multi_worker`` worker).

A re-formed group resumes from the newest backup every worker has (``tfdp.training.backups``;
a ``multi_worker`` group's launcher first gives every member the newest step a survivor saved
here: ``tfdp.launcher.elastic.seed_from_the_survivors``; the from-scratch client keeps the
backups itself), so a survivor's step saved here spares the group the steps trained since that
backup.
"""

import contextlib

import tensorflow as tf

from tfdp.util.errors import UserError
from tfdp.util.logs import logger


def keep_survivors_step(run, step, read_state, holder: str, spread: bool = False) -> None:
    """Back up ``step``, which ``holder`` (what the line names) holds whole, with the state
    ``read_state()`` reads, where it is newer than the newest backup; one line says which.
    ``step`` None: no survivor holds a whole step that can be read (``holder`` names none).
    ``spread``: the launcher gives this worker's save to the whole re-formed group (a
    ``multi_worker`` survivor's), so a step this worker has backed up already is saved again,
    marked as held: the lost worker may not have finished its own backup of it.

    Never an epoch's last step before that epoch's end is backed up: a worker lost while the
    epoch is evaluated leaves the replicas at its last step with the epoch not yet reported,
    and a run resumed from there would go on past an epoch that has no record (after the last,
    export without the test set's figures). The epoch's end writes that backup itself once its
    figures are in (``tfdp.training.epoch_end``)."""
    backups = run.backups
    with contextlib.suppress(UserError):  # A backup that failed stays failed: the one before.
        backups.wait()  # The one being written behind counts (its file is renamed last).
    newest = max(backups.steps(), default=run.first_step)
    if step is None:
        logger.info("%s can be read holding a whole step: the newest backup, of step %d, is the "
                    "one to go on from", holder, newest)
        return
    where = f"{holder} holds step {step}"
    if step < newest or (step == newest and not spread):
        logger.info("%s, no newer than the newest backup", where)
        return
    if step % run.plan.steps_per_epoch == 0:
        logger.info("%s, the end of epoch %d before its figures: the newest backup, of step %d, "
                    "is the one to go on from", where, step // run.plan.steps_per_epoch, newest)
        return
    try:
        state = read_state()
    except tf.errors.OpError as e:
        logger.info("%s, but could not be read (%s): the newest backup, of step %d, is the one "
                    "to go on from", where, type(e).__name__, newest)
        return
    backups.save(step, state, held=True)
    logger.info("%s: saved, the step to go on from", where)
