"""A cluster described by the manager that started this process, instead of a hand-written
``TF_CONFIG``: a Slurm job step (``tfdp.cluster.slurm``) or the pods of a Kubernetes Indexed
Job (``tfdp.cluster.kubernetes``).

``join`` runs first in ``tfdp.train``, before TensorFlow: it sets ``TF_CONFIG`` for this task,
names the default run folder after the job (every task the same folder; a requeued or restarted
job resumes it), and turns a server task of the from-scratch or parameter-server path into
``tfdp.server`` (``exec``: the process the manager signals is the server itself). A
``TF_CONFIG`` already set wins: the manager is not asked.
"""

import json
import os
import sys

from tfdp.cluster import kubernetes, slurm, tf_config
from tfdp.config import RUN_STAMP_ENV
from tfdp import path_registry
from tfdp.launcher.local_cluster import server_flags
from tfdp.logs import logger


def described(strategy: str, num_ps: int, environ=None):
    """``(manager, cluster, kind, index, job)`` from the environment's manager, or None."""
    for manager, find in (("Slurm", slurm.step_task), ("Kubernetes", kubernetes.pod_task)):
        found = find(strategy, num_ps, environ)
        if found:
            return (manager, *found)
    return None


def join(strategy: str, num_ps: int, train_args: list) -> None:
    """Set this process's ``TF_CONFIG`` from its cluster manager, if it has one; a server task
    becomes ``tfdp.server`` with the train flags it shares (``train_args``)."""
    if os.environ.get(tf_config.ENV):
        return
    found = described(strategy, num_ps)
    if not found:
        forgotten = slurm.outside_steps()
        if forgotten:
            logger.warning(forgotten)
        return
    manager, cluster, kind, index, job = found
    os.environ[tf_config.ENV] = json.dumps({"cluster": cluster,
                                            "task": {"type": kind, "index": index}})
    os.environ.setdefault(RUN_STAMP_ENV, f"{manager.lower()}-{job}")
    logger.info("%s: %s %d of %s", manager, kind, index, json.dumps(cluster))
    if path_registry.get(strategy).cluster == path_registry.CLIENT and kind != "chief":
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "tfdp.server",
                                  *server_flags(train_args)])
