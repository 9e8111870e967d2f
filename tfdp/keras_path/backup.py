"""Per-epoch backups for fault tolerance, and resuming from the epoch every worker finished.

Keras 3's ``BackupAndRestore`` has no multi-worker logic (two workers sharing its folder collide
on the h5 file lock) and writes weights and metadata non-atomically. Here every worker keeps its
own folder ``<workdir>/backup/worker-<i>/`` with ``epoch-<n>.weights.h5`` files (written to a
temporary name and renamed, the last two kept). On start the workers agree, with one collective,
on the last epoch that *all* of them finished, and all load that epoch's weights.
"""

import os
import re

import keras
import numpy as np
import tensorflow as tf

from tfdp.logs import logger

_FILE = re.compile(r"^epoch-(\d+)\.weights\.h5$")
KEEP = 2


class EpochBackup(keras.callbacks.Callback):
    """Writes ``epoch-<n>.weights.h5`` at the end of every epoch (n counts finished epochs)."""

    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder

    def on_epoch_end(self, epoch, logs=None):
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"epoch-{epoch + 1}.weights.h5")
        self.model.save_weights(path + ".partial.weights.h5")
        os.replace(path + ".partial.weights.h5", path)
        for old in finished_epochs(self.folder)[:-KEEP]:
            os.remove(os.path.join(self.folder, f"epoch-{old}.weights.h5"))


def worker_folder(workdir: str, worker_index: int) -> str:
    return os.path.join(workdir, "backup", f"worker-{worker_index}")


def finished_epochs(folder: str) -> list:
    if not os.path.isdir(folder):
        return []
    return sorted(int(m.group(1)) for m in map(_FILE.match, os.listdir(folder)) if m)


def agreed_epoch(folder: str, distribution) -> int:
    """The last epoch finished by every worker (0: start afresh)."""
    local = max(finished_epochs(folder), default=0)
    if distribution.num_workers == 1:
        return local
    # Strategy.reduce has SUM and MEAN only: each worker fills its own slot, SUM gathers them.
    slots = np.zeros(distribution.num_workers, np.int64)
    slots[distribution.worker_index] = local
    strategy = distribution.strategy

    @tf.function  # Collectives run eagerly are slow and warn about it.
    def gather():
        per_replica = strategy.run(lambda: tf.constant(slots))  # Each local replica adds it.
        return strategy.reduce("SUM", per_replica, axis=None)

    everyone = gather().numpy() // len(distribution.devices)
    agreed = int(everyone.min())
    if agreed and agreed not in finished_epochs(folder):
        raise RuntimeError(f"no backup of epoch {agreed} in {folder}: found "
                           f"{finished_epochs(folder)}")
    return agreed


def restore(model, folder: str, epoch: int) -> None:
    model.load_weights(os.path.join(folder, f"epoch-{epoch}.weights.h5"))
    logger.info("restored weights of epoch %d from %s", epoch, folder)
