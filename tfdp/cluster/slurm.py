"""The cluster of a Slurm job step, built from Slurm's own environment: ``srun python -m
tfdp.train ...`` with no hand-written ``TF_CONFIG``.

Inside ``srun``, every task has ``SLURM_PROCID`` (its rank in the step), ``SLURM_LOCALID`` (its
rank on its node), ``SLURM_STEP_NODELIST`` and ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``).
From those, as TensorFlow's own ``SlurmClusterResolver`` reads them, every task computes the
same list of task addresses:

* nodes: the node list expanded by each task itself (``tfdp.cluster.slurm_nodes``: Slurm's
  controller is never asked), each node reached by its name resolved where the job runs, or on
  the network the user names (``TFDP_NODE_HOST``, ``TFDP_NETWORK``);
* tasks on nodes: Slurm's default block distribution (tasks 0..k-1 on the first node, ...), or
  cyclic under ``--distribution=cyclic``;
* ports: ``TFDP_PORT`` (then each task's is it plus the task's rank on its node), else the
  step's reserved ports where Slurm reserves them (``srun --resv-ports``, or ``MpiParams=ports=``
  in slurm.conf: ``SLURM_STEP_RESV_PORTS``), else consecutive ports from a start that the job
  and step ids pick (``derived_ports``): tasks sharing a node differ, and two jobs, or two steps
  of one job, on a node differ but by chance (about 1 in 3,200 for two steps of 4 tasks a
  node), below Linux's ephemeral ports. A port that is taken stops its task in one line with
  the remedy.

Placement is checked, not only computed: each task's node and rank on it, as tfdp reads the
distribution, must be the ``SLURM_NODEID`` and ``SLURM_LOCALID`` Slurm gave it, else one line
(a wrong address would hang until ``--collective_timeout``).

Every variable read is checked before anything waits on it
(``tfdp.cluster.env_values``): one line names a variable missing, malformed or out of range.

Who is who (``tf_config.roles``): task 0 is the chief; under ``multi_worker`` every task is a
worker; under ``manual`` the others are ``tfdp.server`` workers, and under
``parameter_server`` the last ``--num_ps`` of them parameter servers. A server task becomes
``tfdp.server`` (``exec``), with the train flags it shares. Every task's default run folder
is named by the job id, so a requeued job (``sbatch --requeue``, same job id) resumes where it
stopped.
"""

import hashlib
import os
import re
from typing import Optional

from tfdp import paths
from tfdp.cluster import env_values, slurm_nodes, tf_config
from tfdp.util.errors import UserError

# Ports derived when neither TFDP_PORT nor Slurm gives them: within PORTS, below Linux's
# ephemeral ports (32768-60999), which any outgoing connection may hold.
PORTS = (10000, 32767)
MAX_DERIVED = 256  # Tasks on one node that derived ports serve.
PORT_REMEDY = ("give the step other ports: TFDP_PORT=<a free port> (each task that plus its rank "
               "on its node), or srun --resv-ports")
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


def node_hosts(environ) -> list:
    """The host of each node of the step, in Slurm's order (``tfdp.cluster.slurm_nodes``)."""
    return slurm_nodes.hosts(slurm_nodes.expand(environ["SLURM_STEP_NODELIST"]), environ)


def task_addresses(environ, tasks: int, rank: int = None) -> list:
    """``host:port`` of every task of the step of ``tasks`` tasks, in rank order (the same list
    on every task). Slurm's variables are checked before a name is resolved; task
    ``rank``'s placement against Slurm's own, where given."""
    counts = expand_counts(environ["SLURM_STEP_TASKS_PER_NODE"])
    if sum(counts) != tasks:
        raise UserError(f"SLURM_STEP_TASKS_PER_NODE={environ['SLURM_STEP_TASKS_PER_NODE']} "
                        f"places {sum(counts)} task(s), SLURM_STEP_NUM_TASKS says {tasks}")
    placed = task_nodes(counts, environ.get("SLURM_DISTRIBUTION", "block"))
    if rank is not None:
        check_placement(environ, placed, rank)
    ports = step_ports(environ, max(counts))
    nodes = node_hosts(environ)
    if len(nodes) != len(counts):
        raise UserError(f"SLURM_STEP_NODELIST names {len(nodes)} node(s), "
                        f"SLURM_STEP_TASKS_PER_NODE {len(counts)}")
    seen, addresses = [0] * len(counts), []
    for node in placed:  # A task's port: its local rank on its node.
        addresses.append(f"{_host(nodes[node])}:{ports[seen[node]]}")
        seen[node] += 1
    return addresses


def step_ports(environ, per_node: int) -> list:
    """The ports of a node's tasks of this step, by their rank on the node: ``TFDP_PORT``'s,
    Slurm's reserved ones, or ``derived_ports``."""
    if environ.get("TFDP_PORT"):
        first = env_values.port(environ, "TFDP_PORT")
        if first + per_node - 1 > tf_config.MAX_PORT:
            raise UserError(f"TFDP_PORT={first}: {per_node} tasks on a node need ports up to "
                            f"{first + per_node - 1}, beyond {tf_config.MAX_PORT}")
        return list(range(first, first + per_node))
    reserved = environ.get("SLURM_STEP_RESV_PORTS")
    if reserved:
        ports = expand_ports(reserved)
        if len(ports) < per_node:
            raise UserError(f"SLURM_STEP_RESV_PORTS={reserved} reserves {len(ports)} port(s) "
                            f"for up to {per_node} tasks on a node: reserve one per task")
        return ports
    job = env_values.integer(environ, "SLURM_JOB_ID", low=0)
    step = env_values.integer(environ, "SLURM_STEP_ID", low=0, default=0)
    return derived_ports(job, step, per_node)


def derived_ports(job: int, step: int, count: int) -> list:
    """``count`` consecutive ports in ``PORTS`` from a start that job and step pick: the same
    on every task, and another for another job or step but by chance ((n + m - 1) in 22,513 for
    steps of n and m tasks a node)."""
    low, high = PORTS
    if count > MAX_DERIVED:
        raise UserError(f"{count} tasks on one node: tfdp derives ports for up to {MAX_DERIVED}; "
                        "give them with TFDP_PORT or srun --resv-ports")
    digest = hashlib.sha256(f"slurm job {job} step {step}".encode()).digest()
    first = low + int.from_bytes(digest[:8], "big") % (high - low + 2 - MAX_DERIVED)
    return list(range(first, first + count))


def check_placement(environ, placed: list, rank: int) -> None:
    """Stop in one line where Slurm put task ``rank`` elsewhere than ``placed`` says (each task's
    node index, in rank order): its SLURM_NODEID and SLURM_LOCALID, where Slurm sets them."""
    node, local = placed[rank], placed[:rank].count(placed[rank])
    slurm_node = env_values.integer(environ, "SLURM_NODEID", low=0, default=node)
    slurm_local = env_values.integer(environ, "SLURM_LOCALID", low=0, default=local)
    if (slurm_node, slurm_local) != (node, local):
        raise UserError(
            f"Slurm placed task {rank} as task {slurm_local} of node {slurm_node} of the step; "
            f"tfdp's reading of SLURM_STEP_TASKS_PER_NODE="
            f"{environ.get('SLURM_STEP_TASKS_PER_NODE')} and SLURM_DISTRIBUTION="
            f"{environ.get('SLURM_DISTRIBUTION', 'block')} puts it as task {local} of node "
            f"{node}: give srun --distribution=block (or cyclic), one homogeneous step")


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def outside_steps(environ=None, command: str = "python -m tfdp.train ...") -> Optional[str]:
    """One line when this process runs in a Slurm job but in none of its job steps, where it
    would train alone without a word: an ``salloc`` shell (on the submitting host, not the
    job's nodes) or a batch script of a job of several tasks or nodes; ``command`` is what to
    run with srun. None otherwise."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID")
    if not job or env.get("SLURM_STEP_ID"):
        return None
    tasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS") or "1"
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "?"
    job_is = f"Slurm job {job} ({tasks} task(s) on {nodes})"
    if not env.get("SLURMD_NODENAME"):
        return (f"in {job_is}'s salloc shell, not on its nodes: this process trains alone here, "
                f"on the submitting host; run it on the job's tasks with srun {command} "
                "(srun -n 1 for one process on one of its nodes)")
    if tasks.strip() not in ("", "1") or env.get("SLURM_JOB_NUM_NODES", "1") != "1":
        return (f"in {job_is}'s batch script, not in a step of its tasks: this process trains "
                f"alone on {env['SLURMD_NODENAME']}; run it on the job's tasks with srun "
                f"{command}")
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
    if paths.get(strategy).cluster == paths.NO_CLUSTER:
        raise UserError(f"--strategy={strategy} trains in one process, and this Slurm step has "
                        f"{tasks} tasks: "
                        "srun -n 1 (--gpus for its devices), or --strategy=multi_worker")
    env_values.require(env, STEP_VARIABLES, "a Slurm job step",
                       "run the tasks with srun, which sets them (docs/clusters.md)")
    rank = env_values.integer(env, "SLURM_PROCID", 0, tasks - 1)
    addresses = task_addresses(env, tasks, rank)
    if tf_config.port_taken(addresses[rank]):
        raise UserError(f"port {addresses[rank].rpartition(':')[2]} of Slurm task {rank} "
                        f"({addresses[rank]}) is already in use on this node: {PORT_REMEDY}")
    kinds = tf_config.roles(strategy, len(addresses), num_ps)
    kind, index = kinds[rank]
    return tf_config.cluster_of(addresses, kinds), kind, index, env["SLURM_JOB_ID"]
