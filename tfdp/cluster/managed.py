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

from tfdp import paths
from tfdp.cluster import kubernetes, slurm, task_gpus, tf_config
from tfdp.config.flags import server_args
from tfdp.config.settings import RUN_STAMP_ENV
from tfdp.util.errors import UserError
from tfdp.util.logs import logger


def interactive() -> bool:
    """Whether this process is an interactive session (a Jupyter kernel, ``python -i``, a shell,
    ``python -c``): one with no script file of its own."""
    main = sys.modules.get("__main__")
    return hasattr(sys, "ps1") or sys.flags.interactive or not getattr(main, "__file__", None)


def described(strategy: str, num_ps: int, environ=None):
    """``(manager, cluster, kind, index, job)`` from the environment's manager, or None."""
    for manager, find in (("Slurm", slurm.step_task), ("Kubernetes", kubernetes.pod_task)):
        found = find(strategy, num_ps, environ)
        if found:
            return (manager, *found)
    return None


def check_task(strategy: str) -> None:
    """Refuse in one line, before TensorFlow starts, a ``TF_CONFIG`` (hand-written, or ``join``'s)
    whose task ``tfdp.train`` is not on ``strategy``'s path (a worker of the from-scratch
    client's cluster, say): the path's own reading of it, later, says the same."""
    if not os.environ.get(tf_config.ENV):
        return
    path = paths.get(strategy)
    if path.cluster == paths.CLIENT:
        tf_config.task(kinds=("chief",), program=path.program)
    elif path.cluster == paths.WORKERS:
        tf_config.task(program=path.program)


def join(config, caller: str = "tfdp.train") -> None:
    """Set this process's ``TF_CONFIG`` from its cluster manager, if it has one, and its GPUs
    (``tfdp.cluster.task_gpus``); a server task becomes ``tfdp.server`` with the flags it shares
    with ``config``'s client, where this process may: not an interactive one (a Jupyter kernel,
    a shell), whose session would end."""
    if os.environ.get(tf_config.ENV):
        return
    strategy = config.strategy
    found = described(strategy, config.num_ps)
    if not found:
        forgotten = slurm.outside_steps(command="python -m tfdp.train ..." if caller ==
                                        "tfdp.train" else "python <your script>")
        if forgotten:
            logger.warning(forgotten)
        return
    manager, cluster, kind, index, job = found
    os.environ[tf_config.ENV] = json.dumps({"cluster": cluster,
                                            "task": {"type": kind, "index": index}})
    os.environ.setdefault(RUN_STAMP_ENV, f"{manager.lower()}-{job}")
    logger.info("%s: %s %d of %s", manager, kind, index, json.dumps(cluster))
    listed = task_gpus.visible_gpus(os.environ)
    visible = task_gpus.apply(cluster, kind, index, config.num_gpus).get(task_gpus.VISIBLE)
    if listed and visible is not None:
        logger.info("%s: %s %d %s", manager, kind, index,
                    f"on GPU(s) {visible}" if visible else "off the GPUs (it holds no replica)")
    if paths.get(strategy).cluster == paths.CLIENT and kind != "chief":
        if interactive():
            raise UserError(
                f"{caller} in {manager} task {kind} {index} of --strategy={strategy}, whose "
                "tasks but the chief are tfdp.servers: an interactive session cannot become "
                "one; run a script (python script.py in every task) or --strategy=multi_worker")
        logger.info("%s: %s %d becomes tfdp.server", manager, kind, index)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "tfdp.server",
                                  *server_args(config)])
