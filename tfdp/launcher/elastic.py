"""``--num_workers=MIN:MAX`` and ``--max_restarts=N``: a group that goes on when a worker is
lost, on the paths that regroup (``tfdp.paths.Path.regroups``): ``multi_worker``'s workers, and
the ``tfdp.server`` workers of the from-scratch client.

The launcher starts MAX workers. When one dies (killed, crashed) or hangs (its peers' watchdog,
or the client's, gives up on it: ``tfdp.launcher.supervise.hung``, ``supervise_client``), the
group re-forms without the user: the survivors are stopped at once (TensorFlow cannot take a
worker out of a ``MultiWorkerMirroredStrategy`` group in place, and their collectives wait for
the lost one; the from-scratch client's step runs on every server's devices and cannot finish
without one), and the launcher starts the group again in the same run folder, from the newest
backup every worker has (the client's, where a client keeps them, which first backs up the
newest whole step a surviving server's replica holds where it can read one; else
``--backup_every`` bounds what is redone): with the lost worker started again while
``--max_restarts`` allows (torchrun's name: a worker that returns), else one worker fewer,
while at least MIN are left; the from-scratch client itself, killed, is started again while
``--max_restarts`` allows (the group re-forms at its size, with fresh servers, from the
client's newest backup). On emulated hosts
(``--hosts``) a worker whose host's link is down is lost, ended or not (the launcher reads the
links once its peers have lost contact), and the group re-forms on the hosts still up.
SIGUSR1 to the launcher takes a worker in while the group trains, up to MAX (on emulated hosts,
where one is up and free): the workers (or the client) save one common step and stop, as for a
preemption, and the group re-forms from that step one larger, a joining ``multi_worker`` worker
starting from a copy of worker 0's backup (nothing is trained again).

The model stays the one an uninterrupted run trains: ``--batch_size`` is the global batch, so
the per-replica batches grow to keep it, and the data order is a function of the seed and the
epoch alone (``tfdp.data.pipeline``); the paths train the same model on any replica count at a
fixed global batch (tests/test_resume_exactly.py, tests/test_elastic.py)."""

import os
import shutil
import time
import zipfile
from typing import Optional, Tuple

from tfdp import paths
from tfdp.config.checks import parse_interval
from tfdp.config.settings import GROUP_GOES_ON_ENV, REGROUPED_ENV, Config
from tfdp.launcher.regrouping import (BACKUP_FILE, BACKUPS, HELD, backup_folder, backup_name,
                                      backup_steps)
from tfdp.launcher.rendezvous import LOST_AFTER
from tfdp.launcher.supervise import CUT_OFF

# A member of a Slurm step's or an Indexed Job's group whose agent has gone silent
# (``tfdp.launcher.managed_group``).
UNHEARD = "unheard"
STOPPED = "stopped"  # ... whose agent was stopped by a signal, after its step was saved.

# How each lost worker is said, and what the group does next; ``{kept}``: whose backup.
LEFT = ("tfdp.launch: {who} left ({why}); going on with {size} of "
        "--num_workers={asked}: the group re-forms from {kept}, at the same global batch")


def sizes(num_workers) -> Tuple[Optional[tuple], str]:
    """``((MIN, MAX), "")`` from ``--num_workers``: ``N`` (``N:N``, not elastic) or ``MIN:MAX``;
    else ``(None, the one line that says what is wrong)``."""
    text = str(num_workers)
    low, _, high = text.partition(":")
    try:
        low, high = int(low), int(high or low)
    except ValueError:
        return None, (f"--num_workers={text}: give a number of workers, or MIN:MAX for a group "
                      "that goes on with at least MIN when workers are lost")
    if low < 1 or high < low:
        return None, (f"--num_workers={text}: the workers must be a positive integer, or MIN:MAX "
                      "with 1 <= MIN <= MAX")
    return (low, high), ""


def refusal(low: int, high: int, config: Config, hosts: bool, restarts: int = 0) -> str:
    """What ``MIN:MAX`` or ``--max_restarts`` cannot do with the workers' ``config``, in one
    line ("" if nothing)."""
    if low == high and not restarts:
        return ""
    asked, mend = ((f"--num_workers={low}:{high}", "give a number") if low < high else
                   (f"--max_restarts={restarts}", "leave --max_restarts out"))
    path = paths.get(config.strategy)
    if not path.regroups:
        regrouping = [p.name for p in paths.all_paths() if p.regroups]
        why = ("a lost worker is started again already" if path.restart_lost_workers else
               "its cluster cannot re-form")
        return (f"{asked} re-forms a --strategy={paths.either(regrouping)} group; "
                f"--strategy={config.strategy}: {why}; {mend}")
    if hosts and restarts:
        return (f"--max_restarts={restarts} with --hosts: a worker whose emulated host is cut "
                "off cannot be started there again; leave --max_restarts out (MIN:MAX goes on "
                "without it)")
    if config.per_replica_batch_size and low < high:
        return (f"{asked} keeps the global batch whatever the group's size, so that the model "
                "is the same: give the workers --batch_size (the global batch) instead of "
                "--per_replica_batch_size")
    if parse_interval(config.backup_every) == (None, None):
        return (f"{asked} re-forms the group from the newest backup: --backup_every=0 would "
                "redo whole epochs; give it steps or seconds")
    return ""


class Group:
    """A group's size as workers are lost: each started again while ``--max_restarts`` allows,
    else gone while at least MIN are left (``asked``: the ``--num_workers`` given; ``client``:
    its workers are the servers of a client, which keeps the backups)."""

    def __init__(self, size_range: tuple, restarts: int, asked: str, client: bool = False):
        (self.fewest, self.most), self.size = size_range, size_range[1]
        self.restarts, self.restarts_left, self.asked = restarts, restarts, asked
        self.client = client
        # What the next group re-forms after ((Unix seconds, what) the launcher saw), for its
        # chief's line on training again (``REGROUPED_ENV``).
        self.after = None

    @property
    def goes_on(self) -> bool:
        """Whether a lost worker can leave the run going at all."""
        return self.fewest < self.most or self.restarts > 0

    @property
    def departed(self) -> bool:
        """Whether workers have gone for good (their backups are to be cleared at the end)."""
        return self.size < self.most

    def survivors_needed(self) -> int:
        """Survivors enough, with the workers started again, for a group of at least MIN."""
        return max(1, self.fewest - self.restarts_left)

    def lose(self, failed: list) -> list:
        """The group without the ``failed`` workers ((index, exit code) each) or with them
        started again: the launcher's line for each."""
        used, back = self.restarts - self.restarts_left, min(len(failed), self.restarts_left)
        self.restarts_left -= back
        self.size += back - len(failed)
        indices = [str(index) for index, _ in failed]
        self.after = (time.time(), f"worker{'s' if len(indices) > 1 else ''} "
                                   f"{' and '.join(indices)} left")
        return [left_line(index, code, self.size, self.asked, used + n + 1 if n < back else 0,
                          self.restarts, self.client) for n, (index, code) in enumerate(failed)]

    def joining(self) -> tuple:
        """A worker asks to join (SIGUSR1 to the launcher): (whether the group has room for it,
        the launcher's line)."""
        if self.size >= self.most:
            return False, (f"tfdp.launch: a worker asked to join (SIGUSR1); the group has "
                           f"--num_workers={self.asked}'s {self.most} already")
        self.after = (time.time(), "a worker asked to join")
        saves = "the chief saves its step" if self.client else "every worker saves one common step"
        return True, (f"tfdp.launch: a worker joins (SIGUSR1): {saves}, and the group re-forms "
                      f"from it with {self.size + 1} of --num_workers={self.asked}")

    def grow(self) -> None:
        self.size += 1

    def start_the_chief_again(self, code: int) -> str:
        """The from-scratch client was killed (``code``): started again, one of
        ``--max_restarts``, the group at its size; the launcher's line."""
        self.restarts_left -= 1
        self.after = (time.time(), "the chief left")
        return (f"tfdp.launch: the chief left (exited with {code}); starting it again "
                f"({self.restarts - self.restarts_left}/{self.restarts} of --max_restarts): "
                f"the group of {self.size} re-forms from the chief's newest backup")

    def tell_the_workers(self, specs: list) -> None:
        """Where the group goes on, each worker's line on losing a peer says the launcher
        re-forms it (``GROUP_GOES_ON_ENV``), not that the run waits for the same command; a
        group re-formed after a loss or a join is told what it follows (``REGROUPED_ENV``)."""
        if self.goes_on:
            flags = f"--num_workers={self.asked}" + (
                f" --max_restarts={self.restarts}" if self.restarts else "")
            regrouped = self.regrouped_env()
            for spec in specs:
                spec.env.update({GROUP_GOES_ON_ENV: flags, **regrouped})
        self.after = None

    def regrouped_env(self) -> dict:
        """For the workers of the group re-formed next: what it follows, and when the launcher
        (or a managed group's agent) saw it (``REGROUPED_ENV``); {} for a first group."""
        after, self.after = self.after, None
        return {REGROUPED_ENV: f"{after[0]:.3f} {after[1]}"} if after else {}


def left_line(index: int, code: int, size: int, asked: str, again: int = 0,
              restarts: int = 0, client: bool = False) -> str:
    """The launcher's line for a lost worker: the group goes on without it, or with it started
    again (``again``: the how-manieth of ``--max_restarts``'s ``restarts``), from the newest
    backup (the ``client``'s, where the workers are its servers); ``index`` None: a worker the
    launcher cannot name (one of a client's servers hung)."""
    kept = "the chief's newest backup" if client else "the newest backup every worker has"
    peers = "the chief" if client else "its peers"
    why = (f"hung: {peers} lost contact with it" if code is None else
           "its host's link is down" if code == CUT_OFF else
           f"nothing heard from its task for {LOST_AFTER:.0f} s" if code == UNHEARD else
           "its task was stopped, after every worker saved its step" if code == STOPPED else
           f"exited with {code}")
    who = "a worker" if index is None else f"worker {index}"
    if again:
        return (f"tfdp.launch: {who} left ({why}); starting it again "
                f"({again}/{restarts} of --max_restarts): the group of {size} re-forms from "
                f"{kept}")
    return LEFT.format(who=who, why=why, size=size, asked=asked, kept=kept)


def seed_the_joiner(run_dir: str, index: int) -> None:
    """Worker ``index`` joins: its backups are worker 0's newest (every replica holds the same
    state), in place of any it left behind when it departed, so that the newest backup every
    worker has is the common step the group has just saved. Nothing to copy before worker 0's
    first backup: the group then starts from the beginning."""
    newest = _newest_backup(run_dir, 0)
    if newest is None:
        return
    joiner = backup_folder(run_dir, index)
    shutil.rmtree(joiner, ignore_errors=True)
    _copy_backup(newest, joiner)


def seed_from_the_survivors(run_dir: str, survivors: list, size: int) -> None:
    """After a loss: every worker of the group re-formed with ``size`` holds the newest step a
    survivor (a worker index of the group before) saved as the step it held whole
    (``tfdp.training.survivors``), so that the newest backup every worker has is that step:
    every replica holds the same state at a step, whichever index held it. Only such a save,
    never an epoch's last step: a survivor's backup of an epoch's end says nothing of whether
    the chief, if it was the one lost, had recorded that epoch."""
    found = [path for path in (_newest_backup(run_dir, i) for i in survivors)
             if path and _held(path)]
    if not found:
        return
    newest = max(found, key=_step_of)
    for index in range(size):
        folder = backup_folder(run_dir, index)
        if not os.path.exists(os.path.join(folder, os.path.basename(newest))):
            _copy_backup(newest, folder)


def _step_of(path: str) -> int:
    return int(BACKUP_FILE.match(os.path.basename(path))[1])


def _newest_backup(run_dir: str, index: int) -> Optional[str]:
    folder = backup_folder(run_dir, index)
    steps = backup_steps(folder)
    return os.path.join(folder, backup_name(steps[-1])) if steps else None


def _held(path: str) -> bool:
    """Whether the backup at ``path`` is a survivor's step (``Backups.save(held=True)``)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return f"{HELD}.npy" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _copy_backup(path: str, folder: str) -> None:
    """``path`` into ``folder`` under its name, renamed last: never half a file under it."""
    os.makedirs(folder, exist_ok=True)
    target = os.path.join(folder, os.path.basename(path))
    shutil.copyfile(path, target + ".copying")
    os.replace(target + ".copying", target)


def clear_departed(run_dir: str, size: int) -> None:
    """The run is complete: the backups of workers beyond the group's last ``size`` are spent
    too (each worker clears its own; the last to finish removes ``backup/``)."""
    folder = os.path.join(run_dir, BACKUPS)
    if not os.path.isdir(folder):
        return
    for name in os.listdir(folder):
        index = name.rpartition("-")[2]
        if name.startswith("worker-") and index.isdigit() and int(index) >= size:
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
    try:
        os.rmdir(folder)
    except OSError:
        pass
