"""The cluster of a Kubernetes Indexed Job, built from what each pod sees: ``python -m
tfdp.train ...`` in every pod, with no hand-written ``TF_CONFIG``.

An Indexed Job (``completionMode: Indexed``) gives each pod ``JOB_COMPLETION_INDEX`` and the
stable hostname ``<job>-<index>``; with ``subdomain`` set to a headless Service, every pod
resolves every other as ``<job>-<index>.<service>``. tfdp reads:

* ``JOB_COMPLETION_INDEX``: this pod's rank;
* ``HOSTNAME`` (Kubernetes sets it to the pod's hostname): the job's name, its ``-<index>``
  removed;
* ``TFDP_NUM_TASKS``: the number of pods (the Job's ``completions``; the manifest sets both);
* ``TFDP_SERVICE``: the headless Service (the pods' ``subdomain``);
* ``TFDP_PORT``: the port every pod listens on (default ``PORT``: each pod has an address of
  its own).

The roles are those of every cluster manager (``tfdp.cluster.tf_config.roles``): pod 0 the
chief, the others workers, or servers of the from-scratch and parameter-server paths.
``docs/clusters.md`` has the manifest.
"""

import os
import re
from typing import Optional

from tfdp.cluster import tf_config
from tfdp.errors import UserError

PORT = 2222
NEEDED = ("HOSTNAME", "TFDP_NUM_TASKS", "TFDP_SERVICE")


def pod_task(strategy: str, num_ps: int, environ=None) -> Optional[tuple]:
    """``(cluster, kind, index, job name)`` of this pod of an Indexed Job of several pods; None
    outside one."""
    env = os.environ if environ is None else environ
    if "JOB_COMPLETION_INDEX" not in env or "TFDP_NUM_TASKS" not in env:
        return None
    missing = [name for name in NEEDED if not env.get(name)]
    if missing:
        raise UserError(f"a Kubernetes Indexed Job pod without {', '.join(missing)}: set them "
                        "in the manifest (docs/clusters.md)")
    index, count = _number(env, "JOB_COMPLETION_INDEX"), _number(env, "TFDP_NUM_TASKS")
    port = _number(env, "TFDP_PORT") if env.get("TFDP_PORT") else PORT
    if not 0 <= index < count:
        raise UserError(f"JOB_COMPLETION_INDEX={index} is outside TFDP_NUM_TASKS={count}: "
                        "set TFDP_NUM_TASKS to the Job's completions")
    hostname = env["HOSTNAME"].split(".")[0]
    match = re.fullmatch(rf"(.+)-{index}", hostname)
    if not match:
        raise UserError(f"HOSTNAME={hostname} is not <job>-{index}, an Indexed Job pod's "
                        "hostname: is the Job's completionMode Indexed?")
    if count < 2:
        return None
    if strategy in tf_config.SINGLE_PROCESS:
        raise UserError(f"--strategy={strategy} trains in one process, and this Indexed Job "
                        f"has {count} pods: completions 1, or --strategy=multi_worker")
    job, service = match[1], env["TFDP_SERVICE"]
    addresses = [f"{job}-{i}.{service}:{port}" for i in range(count)]
    kinds = tf_config.roles(strategy, count, num_ps)
    kind, task_index = kinds[index]
    return tf_config.cluster_of(addresses, kinds), kind, task_index, job


def _number(env, name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise UserError(f"{name}={env[name]!r} is not a number") from None
