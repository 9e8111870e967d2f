"""Backups of a run's state, so a crash, a kill or a preemption loses at most part of an epoch.

What a run needs to go on is its training state (``tfdp.training.state.TrainingState``: the
weights, the optimizer's slots, the weights' averages and the seed states) and its global step:
the rest is a function of the step. So a backup is one ``.npz`` file,
``<workdir>/backup/worker-<i>/step-<n>.npz``, holding the state's arrays, the step and the flags
that decide the training (``identity``: the ``RESUME_FLAGS``). Every path writes one after
every epoch, within an epoch as often as ``--backup_every`` says
(``tfdp.training.backup_interval``), and one at the step where it is preempted, and keeps the
newest ``KEEP``.

* Written behind training (``save_behind``): the state's arrays are copied at the step, and a
  thread writes them while the next steps run; one at a time. A preemption's backup is written
  before the process ends (``save``).

* Written through ``files.write_atomic`` (a new temporary file, fsync, rename): a crash never
  leaves half a backup under a real name. A full disk is a one-line error, and the backup
  before it stays.
* Checked when read: ``.npz`` is a zip with a CRC-32 per array, so a damaged or truncated file
  fails to load; the run says so and falls back to the newest intact backup.
* Resumed only by the same training: a backup written with other flags is refused, naming them.

numpy's own format rather than Keras' ``.weights.h5``: the same files serve the from-scratch
path and the Keras paths, and with Keras' files a full disk under MirroredStrategy crashed the
process (a segmentation fault, reported in issue 11) instead of raising.
"""

import contextlib
import errno
import json
import os
import shutil
import threading
import zipfile

import numpy as np

from tfdp.launcher import regrouping
from tfdp.training.state import TrainingState
from tfdp.util import errors, files
from tfdp.util.errors import UserError
from tfdp.util.logs import logger

# The flags that decide what training computes, step by step: a run resumes from a backup only
# under the same ones (--epochs may grow: the steps before are the same).
RESUME_FLAGS = ("strategy", "model", "num_gpus", "batch_size", "per_replica_batch_size", "lr",
                "scale_lr", "warmup_epochs", "seed", "init", "steps_per_epoch", "allreduce",
                "allreduce_dtype", "precision", "synthetic_data", "sync_batch_norm", "ps_shards",
                "accumulate_steps", "bucket_kb", "recipe", "optimizer", "momentum", "nesterov",
                "beta_1", "beta_2", "rho", "epsilon",
                "weight_decay", "schedule", "label_smoothing", "augment", "ema")


def identity(config) -> dict:
    """The ``RESUME_FLAGS`` of ``config`` (``init`` as resolved), stored in its backups; under a
    one-cycle schedule ``--epochs`` too, since the run's length sets every step's rate."""
    flags = RESUME_FLAGS + (("epochs",) if config.schedule == "one_cycle" else ())
    return dict({name: getattr(config, name) for name in flags}, init=config.initializer)


KEEP = 2


class Backups:
    """The backups of worker ``worker_index`` of the run in ``run_dir``."""

    def __init__(self, run_dir: str, worker_index: int, identity: dict):
        self.run_dir = run_dir
        self.folder = regrouping.backup_folder(run_dir, worker_index)
        self.identity = identity
        self._loaded = {}
        self._behind, self._failed = None, None  # The write behind training, its failure.

    def steps(self) -> list:
        """Steps with a backup file, oldest first (damaged or not)."""
        return regrouping.backup_steps(self.folder)

    def path(self, step: int) -> str:
        return os.path.join(self.folder, regrouping.backup_name(step))

    def save(self, step: int, state: TrainingState, held: bool = False) -> str:
        """Write the backup of ``step`` now (a preemption's or a survivor's: the process ends
        after it), after the one being written behind, if any; keep the newest ``KEEP``.
        ``held``: the step a survivor of a loss held whole, marked so for the launcher
        (``regrouping.HELD``)."""
        self.wait()
        arrays = self._arrays(step, state)
        if held:
            arrays[regrouping.HELD] = np.bool_(True)
        return self._write(step, arrays)

    def save_behind(self, step: int, state: TrainingState) -> str:
        """The backup of ``step`` written behind training: its arrays copied now (the step
        after it may change the variables they came from), written by a thread while training
        goes on; one at a time (a second waits for the first). A failure is raised by the next
        save or ``wait``."""
        self.wait()
        arrays = self._arrays(step, state, copy=True)
        self._behind = threading.Thread(target=self._write_behind, args=(step, arrays),
                                        name=f"backup of step {step}")
        self._behind.start()  # Not a daemon: a process that ends waits for the file.
        return self.path(step)

    def wait(self) -> None:
        """Wait for the backup being written behind; raise its failure."""
        if self._behind is not None:
            self._behind.join()
            self._behind = None
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def _write_behind(self, step: int, arrays: dict) -> None:
        try:
            self._write(step, arrays)
        except Exception as e:  # noqa: BLE001 -- raised in the training thread by wait().
            self._failed = e

    def _arrays(self, step: int, state: TrainingState, copy: bool = False) -> dict:
        arrays = {name: np.array(value, copy=copy) if copy else value
                  for name, value in state.arrays().items()}
        arrays.update(step=np.int64(step), identity=np.array(json.dumps(self.identity,
                                                                        sort_keys=True)))
        return arrays

    def _write(self, step: int, arrays: dict) -> str:
        path = self.path(step)
        try:
            os.makedirs(self.folder, exist_ok=True)
            files.write_atomic(path, lambda f: np.savez(f, **arrays), mode="wb")
        except OSError as e:
            kept = [s for s in self.steps() if s != step]
            raise UserError(
                f"cannot write the backup of step {step} in {self.folder} ({_reason(e)})"
                + (f"; the backup of step {kept[-1]} is kept" if kept else "")
                + f": make room and {errors.rerun()}") from None
        for old in self.steps()[:-KEEP]:
            os.remove(self.path(old))
        return path

    def load(self, step: int) -> TrainingState:
        """The state saved at ``step``; raises ``OSError``/``ValueError`` if damaged."""
        if step not in self._loaded:
            with np.load(self.path(step), allow_pickle=False) as f:
                state = TrainingState.from_arrays(f)  # Reading checks each CRC.
                saved_step, identity = int(f["step"]), json.loads(str(f["identity"]))
            if saved_step != step:
                raise ValueError(f"holds step {saved_step}")
            self._loaded[step] = (state, identity)
        return self._loaded[step][0]

    def intact_steps(self) -> list:
        """Steps whose backup loads, newest first; each damaged one is named in a warning."""
        intact, damaged = [], []
        for step in reversed(self.steps()):
            try:
                self.load(step)
                intact.append(step)
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
                damaged.append((step, e))
        for step, e in damaged:
            logger.warning("the backup %s is damaged (%s: %s)%s", self.path(step),
                           type(e).__name__, e, f"; the backup of step {intact[0]} is intact"
                           if intact else "; no intact backup is left")
        return intact

    def check_identity(self, step: int) -> None:
        """Refuse to resume from a backup that other flags wrote, naming the flags."""
        self.load(step)
        saved = self._loaded[step][1]
        differ = sorted(k for k in set(saved) | set(self.identity)
                        if saved.get(k) != self.identity.get(k))
        if differ:
            theirs = " ".join(f"--{k}={saved.get(k)}" for k in differ)
            ours = " ".join(f"--{k}={self.identity.get(k)}" for k in differ)
            raise UserError(f"{os.path.dirname(os.path.dirname(self.folder))} holds a run "
                            f"trained with {theirs}; this command has {ours}: run it with the "
                            "same flags to resume, or give it another --workdir")

    def clear(self) -> None:
        """The run is complete: its backups are spent. (Left in place, the same command run
        again would "resume" after the last step and only export another version.)"""
        with contextlib.suppress(UserError):  # A backup that failed behind is not needed now.
            self.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
        # The last worker to finish removes backup/ itself; the others find it not empty, or
        # (finishing at the same moment) already gone.
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.folder))


def resume_step(backups: Backups, gather=None) -> int:
    """The newest step this worker (and, with ``gather``, every worker) has an intact backup
    of; 0 to start afresh. ``gather(steps) -> [steps of each worker]`` is a collective."""
    local = backups.intact_steps()
    if local:
        backups.check_identity(local[0])  # Every worker refuses alike: no one waits alone.
    common = set(local)
    if gather is not None:
        for steps in gather(local):
            common &= set(steps)
    step = max(common, default=0)
    if local and step != local[0]:
        logger.warning("resuming from the backup of step %d: the newest one every worker has "
                       "intact", step)
    return step


def _reason(error: OSError) -> str:
    if error.errno == errno.ENOSPC:
        return "no space left on the device"
    return error.strerror or str(error)
