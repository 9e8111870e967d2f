"""A stop for a worker joining, told apart from a preemption.

A launcher whose group goes on (``tfdp.launcher.elastic``) takes a worker in by stopping the
group as a preemption does (SIGTERM: every worker saves one common step, or the from-scratch
client saves its own) and starting it again one larger. The workers' lines must not then say
"run the same command again": the launcher does that itself, at once. So before its SIGTERM it
marks the run folder (``mark``; a managed group's agent whose task is stopped marks it too, where
the others go on without it), and a worker that stops for a signal reads the mark
(``then``) to say what happens next; the launcher removes the mark once the group has stopped
(``unmark``), and any a killed launcher left when it starts again. ``launcher_re_forms`` is the
one wording of what the launcher does next, for a join's line and a loss's
(``tfdp.cluster.tf_config.lost_contact``). A group re-formed after a loss or a join has its
chief say how soon it trains again (``after``). Both sides also read the backups here: where
each worker's lie in the run folder (``backup_folder``) and the array that marks a survivor's
step (``HELD``)."""

import os
import re
from typing import Optional, Tuple

from tfdp.config.settings import GROUP_GOES_ON_ENV, REGROUPED_ENV

MARK = ".tfdp-regrouping"
# The array that marks a backup as the step a survivor of a loss held whole
# (``tfdp.training.survivors``), which the launcher gives every worker of the group it re-forms
# (``tfdp.launcher.elastic.seed_from_the_survivors``).
HELD = "held_by_a_survivor"
# Where worker ``index``'s backups lie in a run folder and what each is named: written by
# ``tfdp.training.backups``, read and copied between workers by the launcher as a group re-forms.
BACKUPS = "backup"
BACKUP_FILE = re.compile(r"^step-(\d+)\.npz$")


def backup_folder(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, BACKUPS, f"worker-{index}")


def backup_name(step: int) -> str:
    return f"step-{step}.npz"


def backup_steps(folder: str) -> list:
    """The steps with a backup file in ``folder`` (a ``backup_folder``), oldest first."""
    if not os.path.isdir(folder):
        return []
    return sorted(int(m[1]) for m in map(BACKUP_FILE.match, os.listdir(folder)) if m)


JOINS, LEAVES = "joins", "leaves"


def mark(run_dir: str, why: str = JOINS) -> None:
    """The group in ``run_dir`` stops for a worker that ``why`` (``JOINS``, ``LEAVES``: an agent
    of a managed group stopped, its task or pod going, the others going on)."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, MARK), "w") as f:
        f.write(f"{why}\n")


def unmark(run_dir: str) -> None:
    try:
        os.remove(os.path.join(run_dir, MARK))
    except FileNotFoundError:
        pass


def launcher_re_forms() -> Optional[str]:
    """In a worker of a launched group that goes on (its flags: ``GROUP_GOES_ON_ENV``), what the
    launcher does after a loss or a join, for the worker's lines; None elsewhere."""
    flags = os.environ.get(GROUP_GOES_ON_ENV)
    return f"tfdp.launch {flags} re-forms the group" if flags else None


def then(run_dir: Optional[str]) -> Optional[str]:
    """What follows a stop of the run in ``run_dir`` that a join or a leaving asked for, for its
    line; None for any other stop."""
    re_forms = launcher_re_forms()
    if not (re_forms and run_dir):
        return None
    try:
        with open(os.path.join(run_dir, MARK)) as f:
            why = f.read().strip()
    except FileNotFoundError:
        return None
    return f"a worker {why}: {re_forms} from it, one {'smaller' if why == LEAVES else 'larger'}"


def after() -> Optional[Tuple[float, str]]:
    """In a worker of a group the launcher re-formed (``REGROUPED_ENV``): when the launcher saw
    the loss or join it follows (Unix seconds) and what it was (``worker 1 left``); else None."""
    since, _, what = os.environ.get(REGROUPED_ENV, "").partition(" ")
    try:
        return float(since), what
    except ValueError:
        return None
