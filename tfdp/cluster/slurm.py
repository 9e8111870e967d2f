"""The cluster of a Slurm job step, built from Slurm's own environment: ``srun python -m
tfdp.train ...`` with no hand-written ``TF_CONFIG``.

Inside ``srun``, every task has ``SLURM_PROCID`` (its rank in the step), ``SLURM_LOCALID`` (its
rank on its node), ``SLURM_STEP_NODELIST`` and ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``).
From those, as TensorFlow's own ``SlurmClusterResolver`` reads them, every task computes the
same list of task addresses:

* nodes: the node list expanded by ``scontrol show hostnames``, each node's address its
  ``NodeAddr`` (``scontrol show node``: the address Slurm itself reaches the node at, which
  resolves wherever ``slurmd`` does);
* tasks on nodes: Slurm's default block distribution (tasks 0..k-1 on the first node, ...), or
  cyclic under ``--distribution=cyclic``;
* ports: the step's reserved ports where Slurm reserves them (``srun --resv-ports``, or
  ``MpiParams=ports=`` in slurm.conf: ``SLURM_STEP_RESV_PORTS``), else one derived from the job
  id and the task's local rank, so tasks sharing a node, and two jobs' tasks on one node,
  differ.

Every variable read is checked before Slurm's controller is asked or anything waits on it
(``tfdp.cluster.env_values``): one line names a variable missing, malformed or out of range.

Who is who (``tf_config.roles``): task 0 is the chief; under ``multi_worker`` every task is a
worker; under ``manual`` the others are ``tfdp.server`` workers, and under
``parameter_server`` the last ``--num_ps`` of them parameter servers. A server task becomes
``tfdp.server`` (``exec``), with the train flags it shares. Every task's default run folder
is named by the job id, so a requeued job (``sbatch --requeue``, same job id) resumes where it
stopped.
"""

import os
import re
import subprocess
from typing import Optional

from tfdp import path_registry
from tfdp.cluster import env_values, tf_config
from tfdp.errors import UserError

# Ports derived when Slurm reserves none: a block of PORTS_PER_JOB per job id from PORT_BASE.
PORT_BASE = 20000
PORTS_PER_JOB = 16
JOB_BLOCKS = 2500  # 20000 + 2500 * 16 = 60000: below Linux's ephemeral ports.
# What srun sets in every task of a step, and tfdp needs of a step of several tasks.
STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
                  "SLURM_JOB_ID")


def in_step(environ=None) -> bool:
    """Whether this process is a task of a Slurm job step (``srun``), not a batch script."""
    env = os.environ if environ is None else environ
    return "SLURM_PROCID" in env and "SLURM_STEP_NODELIST" in env


def expand_counts(text: str) -> list:
    """``SLURM_STEP_TASKS_PER_NODE``: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise UserError(f"SLURM_STEP_TASKS_PER_NODE={text!r} is not Slurm's form (2(x3),1)")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def expand_ports(text: str) -> list:
    """``SLURM_STEP_RESV_PORTS``: ``"12000-12002,12010"`` -> ``[12000, 12001, 12002, 12010]``."""
    ports = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        first, last = (int(match[1]), int(match[2] or match[1])) if match else (0, -1)
        if not match or not 1 <= first <= last <= tf_config.MAX_PORT:
            raise UserError(f"SLURM_STEP_RESV_PORTS={text!r} is not Slurm's form of ports "
                            f"1..{tf_config.MAX_PORT} (12000-12002,12010)")
        ports += range(first, last + 1)
    return ports


def task_nodes(counts: list, distribution: str = "block") -> list:
    """The node index of each task, in rank order, for tasks ``counts[n]`` per node."""
    if distribution.startswith("block") or not distribution:
        return [n for n, count in enumerate(counts) for _ in range(count)]
    if distribution.startswith("cyclic"):
        left, order = list(counts), []
        while any(left):
            for n, count in enumerate(left):
                if count:
                    order.append(n)
                    left[n] -= 1
        return order
    raise UserError(f"SLURM_DISTRIBUTION={distribution}: tfdp builds its cluster for Slurm's "
                    "block or cyclic task distribution; give srun --distribution=block")


def scontrol(*args: str) -> str:
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UserError("a Slurm job step, but no scontrol command to read its nodes: run "
                        "where Slurm's client commands are on PATH") from None
    if done.returncode != 0:
        raise UserError(f"scontrol {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def node_addresses(nodelist: str) -> list:
    """Each node of ``nodelist`` (Slurm's compressed form), by the address Slurm reaches it."""
    names = scontrol("show", "hostnames", nodelist).split()
    addresses = dict(re.findall(r"NodeName=(\S+).*?NodeAddr=(\S+)",
                                scontrol("-o", "show", "node", ",".join(names))))
    return [addresses.get(name, name) for name in names]


def task_addresses(environ, tasks: int) -> list:
    """``host:port`` of every task of the step of ``tasks`` tasks, in rank order (the same list
    on every task). Slurm's variables are checked before its controller is asked."""
    counts = expand_counts(environ["SLURM_STEP_TASKS_PER_NODE"])
    if sum(counts) != tasks:
        raise UserError(f"SLURM_STEP_TASKS_PER_NODE={environ['SLURM_STEP_TASKS_PER_NODE']} "
                        f"places {sum(counts)} task(s), SLURM_STEP_NUM_TASKS says {tasks}")
    placed = task_nodes(counts, environ.get("SLURM_DISTRIBUTION", "block"))
    reserved = environ.get("SLURM_STEP_RESV_PORTS")
    if reserved:
        ports = expand_ports(reserved)
        if len(ports) < max(counts):
            raise UserError(f"SLURM_STEP_RESV_PORTS={reserved} reserves {len(ports)} port(s) "
                            f"for up to {max(counts)} tasks on a node: reserve one per task")
    else:
        if max(counts) > PORTS_PER_JOB:
            raise UserError(f"{max(counts)} tasks on one node: tfdp derives at most "
                            f"{PORTS_PER_JOB} ports a node; reserve them with srun --resv-ports")
        job = env_values.integer(environ, "SLURM_JOB_ID", low=0)
        first = PORT_BASE + job % JOB_BLOCKS * PORTS_PER_JOB
        ports = list(range(first, first + PORTS_PER_JOB))
    nodes = node_addresses(environ["SLURM_STEP_NODELIST"])
    if len(nodes) != len(counts):
        raise UserError(f"SLURM_STEP_NODELIST names {len(nodes)} node(s), "
                        f"SLURM_STEP_TASKS_PER_NODE {len(counts)}")
    seen, addresses = [0] * len(counts), []
    for node in placed:  # A task's port: its local rank on its node.
        addresses.append(f"{_host(nodes[node])}:{ports[seen[node]]}")
        seen[node] += 1
    return addresses


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def outside_steps(environ=None) -> Optional[str]:
    """One line when this process runs in a Slurm job but in none of its job steps, where it
    would train alone without a word: an ``salloc`` shell (on the submitting host, not the
    job's nodes) or a batch script of a job of several tasks or nodes. None otherwise."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID")
    if not job or env.get("SLURM_STEP_ID"):
        return None
    tasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS") or "1"
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "?"
    job_is = f"Slurm job {job} ({tasks} task(s) on {nodes})"
    if not env.get("SLURMD_NODENAME"):
        return (f"in {job_is}'s salloc shell, not on its nodes: this process trains alone here, "
                "on the submitting host; run it on the job's tasks with srun python -m "
                "tfdp.train ... (srun -n 1 for one process on one of its nodes)")
    if tasks.strip() not in ("", "1") or env.get("SLURM_JOB_NUM_NODES", "1") != "1":
        return (f"in {job_is}'s batch script, not in a step of its tasks: this process trains "
                f"alone on {env['SLURMD_NODENAME']}; run it on the job's tasks with srun "
                "python -m tfdp.train ...")
    return None


def step_task(strategy: str, num_ps: int, environ=None) -> Optional[tuple]:
    """``(cluster, kind, index, job id)`` of this task of a Slurm step that spans several
    tasks; None outside one, or in a step of one task."""
    env = os.environ if environ is None else environ
    if not in_step(env):
        return None
    counted = "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    tasks = env_values.integer(env, counted, low=1, default=1)
    if tasks < 2:
        return None
    if path_registry.get(strategy).cluster == path_registry.NO_CLUSTER:
        raise UserError(f"--strategy={strategy} trains in one process, and this Slurm step has "
                        f"{tasks} tasks: "
                        "srun -n 1 (--gpus for its devices), or --strategy=multi_worker")
    env_values.require(env, STEP_VARIABLES, "a Slurm job step",
                       "run the tasks with srun, which sets them (docs/clusters.md)")
    rank = env_values.integer(env, "SLURM_PROCID", 0, tasks - 1)
    addresses = task_addresses(env, tasks)
    kinds = tf_config.roles(strategy, len(addresses), num_ps)
    kind, index = kinds[rank]
    return tf_config.cluster_of(addresses, kinds), kind, index, env["SLURM_JOB_ID"]
