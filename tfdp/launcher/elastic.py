"""``--num_workers=MIN:MAX``: a ``multi_worker`` group that goes on when a worker is lost.

The launcher starts MAX workers. When one dies (killed, crashed) and at least MIN are left, the
group re-forms without the user: the survivors are stopped at once (TensorFlow cannot take a
worker out of a ``MultiWorkerMirroredStrategy`` group in place, and their collectives wait for
the lost one), and the launcher starts the group again with one worker fewer, in the same run
folder, from the newest backup every worker has (``--backup_every`` bounds what is redone).

The model stays the one an uninterrupted run trains: ``--batch_size`` is the global batch, so
the per-replica batches grow to keep it, and the data order is a function of the seed and the
epoch alone (``tfdp.data.pipeline``); the paths train the same model on any replica count at a
fixed global batch (tests/test_resume_exactly.py, tests/test_elastic.py)."""

import os
import shutil
from typing import Optional, Tuple

from tfdp import paths
from tfdp.config.checks import parse_interval
from tfdp.config.settings import Config

# How each lost worker is said, and what the group does next.
LEFT = ("tfdp.launch: worker {index} left (exited with {code}); going on with {size} of "
        "--num_workers={asked}: the group re-forms from the newest backup every worker has, "
        "at the same global batch")


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


def refusal(low: int, high: int, config: Config, hosts: bool) -> str:
    """What ``MIN:MAX`` cannot do with the workers' ``config``, in one line ("" if nothing)."""
    if low == high:
        return ""
    path = paths.get(config.strategy)
    if path.cluster != paths.WORKERS:
        again = " (a lost one is started again already)" if path.restart_lost_workers else ""
        return (f"--num_workers={low}:{high} re-forms a --strategy=multi_worker group; "
                f"--strategy={config.strategy}'s workers are tfdp.servers of one client{again}: "
                "give a number")
    if hosts:
        return (f"--num_workers={low}:{high} with --hosts: an emulated host whose link is cut "
                "keeps its worker alive, and the group cannot yet tell it from a slow one; "
                "give a number")
    if config.per_replica_batch_size:
        return (f"--num_workers={low}:{high} keeps the global batch whatever the group's size, "
                "so that the model is the same: give the workers --batch_size (the global "
                "batch) instead of --per_replica_batch_size")
    if parse_interval(config.backup_every) == (None, None):
        return (f"--num_workers={low}:{high} re-forms the group from the newest backup: "
                "--backup_every=0 would redo whole epochs; give it steps or seconds")
    return ""


def left_line(index: int, code: int, size: int, asked: str) -> str:
    return LEFT.format(index=index, code=code, size=size, asked=asked)


def clear_departed(run_dir: str, size: int) -> None:
    """The run is complete: the backups of workers beyond the group's last ``size`` are spent
    too (each worker clears its own; the last to finish removes ``backup/``)."""
    folder = os.path.join(run_dir, "backup")
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
