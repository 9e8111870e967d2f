"""Which GPUs a task of a cluster trains on, set before TensorFlow starts (it reads
``CUDA_VISIBLE_DEVICES`` once).

A manager may give each task its own GPUs (Slurm's ``--gpus-per-task``: each task then sees
only its own), or give a node's GPUs to all of its tasks (``--gres=gpu:4 --ntasks-per-node=4``:
every task sees all four, and each would take them all). In the second case each worker task
takes ``--num_gpus`` of them by its rank among the node's workers, as TensorFlow's
``SlurmClusterResolver`` does with ``auto_set_gpu``. A task that holds no replica (the
from-scratch path's client, the parameter-server path's coordinator and its servers) is kept off
the GPUs, and every task grows its GPU memory as it needs it instead of taking it all at start.
"""

import os
from typing import Optional

from tfdp.util.errors import UserError

VISIBLE = "CUDA_VISIBLE_DEVICES"
GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
# Where Slurm lists a job's or step's GPUs when it leaves CUDA_VISIBLE_DEVICES to the tasks.
SLURM_GPUS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")


def node_workers(cluster: dict, kind: str, index: int) -> int:
    """This task's rank among the worker tasks on its host (the host part of its address)."""
    if kind != "worker":
        return 0
    host = cluster["worker"][index].rpartition(":")[0]
    return [a.rpartition(":")[0] for a in cluster["worker"][:index]].count(host)


def visible_gpus(environ) -> Optional[list]:
    """The GPU ids this task may use as its manager set them, or None where nothing says."""
    for name in (VISIBLE, *SLURM_GPUS):
        if name in environ:
            return [g.strip() for g in environ[name].split(",") if g.strip()]
    return None


def assign(environ, kind: str, rank_on_node: int, num_gpus: int) -> dict:
    """The variables to set for a ``kind`` task, ``rank_on_node``-th worker on its node, that
    trains on ``num_gpus`` devices: ``{}`` when what it sees is already its own."""
    settings = {} if environ.get(GROWTH) else {GROWTH: "true"}
    if kind != "worker":
        return {**settings, VISIBLE: ""}  # No replica here: none of the node's GPUs.
    gpus = visible_gpus(environ)
    if gpus is None or len(gpus) <= num_gpus:
        return settings  # Its own (or none known): fewer are split into logical devices.
    first = rank_on_node * num_gpus
    if first + num_gpus > len(gpus):
        raise UserError(
            f"this node's workers share {len(gpus)} GPU(s) ({', '.join(gpus)}), and worker "
            f"{rank_on_node + 1} of the node needs --num_gpus={num_gpus} more: give each task its "
            "own (srun --gpus-per-task), fewer tasks per node, or a smaller --num_gpus")
    return {**settings, VISIBLE: ",".join(gpus[first:first + num_gpus])}


def apply(cluster: dict, kind: str, index: int, num_gpus: int, environ=None) -> dict:
    """Set this task's GPU variables in ``environ`` (this process's); return what was set."""
    env = os.environ if environ is None else environ
    settings = assign(env, kind, node_workers(cluster, kind, index), num_gpus)
    env.update(settings)
    return settings
