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

Each is checked before anything waits on it (``tfdp.cluster.env_values``): one line names a
variable missing, not a number, or out of range.

The roles are those of every cluster manager (``tfdp.cluster.tf_config.roles``): pod 0 the
chief, the others workers, or servers of the from-scratch and parameter-server paths.
``docs/clusters.md`` has the manifest.
"""

import os
import re
from typing import Optional

from tfdp import paths
from tfdp.cluster import env_values, tf_config
from tfdp.util.errors import UserError

PORT = 2222
NEEDED = ("HOSTNAME", "TFDP_NUM_TASKS", "TFDP_SERVICE")


def pod_task(strategy: str, num_ps: int, environ=None) -> Optional[tuple]:
    """``(cluster, kind, index, job name)`` of this pod of an Indexed Job of several pods; None
    outside one."""
    env = os.environ if environ is None else environ
    if "JOB_COMPLETION_INDEX" not in env or "TFDP_NUM_TASKS" not in env:
        return None
    env_values.require(env, NEEDED, "a Kubernetes Indexed Job pod",
                       "set them in the manifest (docs/clusters.md)")
    index = env_values.integer(env, "JOB_COMPLETION_INDEX", low=0)
    count = env_values.integer(env, "TFDP_NUM_TASKS", low=1)
    port = env_values.port(env, "TFDP_PORT", default=PORT)
    service = env_values.dns_name(env, "TFDP_SERVICE")
    if index >= count:
        raise UserError(f"JOB_COMPLETION_INDEX={index} is outside TFDP_NUM_TASKS={count}: "
                        "set TFDP_NUM_TASKS to the Job's completions")
    hostname = env["HOSTNAME"].split(".")[0]
    match = re.fullmatch(rf"(.+)-{index}", hostname)
    if not match:
        raise UserError(f"HOSTNAME={hostname} is not <job>-{index}, an Indexed Job pod's "
                        "hostname: is the Job's completionMode Indexed?")
    if count < 2:
        return None
    if paths.get(strategy).cluster == paths.NO_CLUSTER:
        raise UserError(f"--strategy={strategy} trains in one process, and this Indexed Job "
                        f"has {count} pods: completions 1, or --strategy=multi_worker")
    job = match[1]
    addresses = [f"{job}-{i}.{service}:{port}" for i in range(count)]
    kinds = tf_config.roles(strategy, count, num_ps)
    kind, task_index = kinds[index]
    return tf_config.cluster_of(addresses, kinds), kind, task_index, job
