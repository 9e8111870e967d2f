"""Who this process is in a multi-worker cluster, read from ``TF_CONFIG`` without TensorFlow.

``TF_CONFIG`` holds ``{"cluster": {"chief": [...], "worker": ["host:port", ...]}, "task":
{"type": "worker", "index": i}}``. Everything a user can get wrong in it is refused here in one
line, before TensorFlow starts a server on it: TensorFlow's own errors for a bad task index or a
port in use are tracebacks that do not name the variable or the port.
"""

import dataclasses
import errno
import json
import os
import re
import socket
import time

from tfdp import paths
from tfdp.launcher import regrouping
from tfdp.util import errors
from tfdp.util.errors import UserError

MAX_PORT = 65535

ENV = "TF_CONFIG"
_EXAMPLE = '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}'


@dataclasses.dataclass(frozen=True)
class Task:
    cluster: dict          # job name -> list of "host:port"
    type: str              # "chief" or "worker"
    index: int             # within its job

    @property
    def workers(self) -> list:
        """Every training process, chief first: ``[(name, address), ...]``."""
        return ([(f"chief {i}", a) for i, a in enumerate(self.cluster.get("chief", []))]
                + [(f"worker {i}", a) for i, a in enumerate(self.cluster.get("worker", []))])

    @property
    def worker_index(self) -> int:
        """Position among ``workers`` (0 is the chief)."""
        offset = len(self.cluster.get("chief", [])) if self.type == "worker" else 0
        return offset + self.index

    @property
    def peers(self) -> list:
        """The other training processes: ``[(name, address), ...]``."""
        return [(name, address) for name, address in self.workers if address != self.address]

    @property
    def address(self) -> str:
        return self.cluster[self.type][self.index]

    @property
    def is_chief(self) -> bool:
        return self.worker_index == 0


def task(environ=None, kinds=("chief", "worker"), program="tfdp.train") -> Task:
    """This process's task (one of ``kinds``, the task types ``program`` runs). Without
    ``TF_CONFIG``: a cluster of one worker, handy for trying the multi-worker path locally."""
    raw = (os.environ if environ is None else environ).get(ENV)
    if not raw:
        return Task({"worker": ["localhost"]}, "worker", 0)
    try:
        config = json.loads(raw)
        cluster, task_ = config["cluster"], config["task"]
        kind, index = task_["type"], task_["index"]
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{ENV} is not valid ({type(e).__name__}: {e}): it needs {_EXAMPLE}")
    if not isinstance(cluster, dict) or not all(
            isinstance(v, list) and all(isinstance(a, str) for a in v) for v in cluster.values()):
        raise UserError(f"{ENV}: cluster must map job names to lists of \"host:port\", got "
                        f"{cluster!r}")
    if kind not in kinds:
        raise UserError(f"{ENV}: task type {kind!r} is not one {program} runs "
                        f"({', '.join(kinds)})")
    jobs = cluster.get(kind, [])
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(jobs):
        raise UserError(f"{ENV}: task index {index!r} is out of range: the cluster has "
                        f"{len(jobs)} {kind} task(s), indexes 0..{len(jobs) - 1}")
    if len(cluster.get("chief", [])) > 1:
        raise UserError(f"{ENV}: a cluster has at most one chief, got {len(cluster['chief'])}")
    for job, addresses in cluster.items():
        for i, address in enumerate(addresses):
            port = address.rpartition(":")[2]
            if not (port.isdigit() and 1 <= int(port) <= MAX_PORT):
                raise UserError(f"{ENV}'s {job} {i} ({address!r}) has no port 1..{MAX_PORT}: "
                                "give every task as host:port")
    return Task(cluster, kind, index)


def roles(strategy: str, count: int, num_ps: int) -> list:
    """``(kind, index)`` of each of ``count`` tasks a cluster manager started, in rank order:
    task 0 the chief; under ``multi_worker`` every task a worker (task 0 worker 0, the chief);
    else the client ``chief``, then the ``tfdp.server`` workers, then ``num_ps`` parameter
    servers under ``parameter_server`` (``tfdp.launch``'s order)."""
    path = paths.get(strategy)
    if path.cluster == paths.WORKERS:
        return [("worker", i) for i in range(count)]
    servers = num_ps if path.parameter_servers else 0
    workers = count - 1 - servers
    if workers < 1:
        raise UserError(f"--strategy={strategy} on {count} task(s) needs a client, a worker"
                        + (f" and --num_ps={num_ps} parameter server(s)" if servers else "")
                        + f": {2 + servers} tasks or more")
    return ([("chief", 0)] + [("worker", i) for i in range(workers)]
            + [("ps", j) for j in range(servers)])


def cluster_of(addresses: list, kinds: list) -> dict:
    """TF_CONFIG's cluster: each job's addresses, in the order of ``kinds``."""
    jobs = {}
    for address, (kind, _) in zip(addresses, kinds):
        jobs.setdefault(kind, []).append(address)
    return jobs


def client_task(program: str, jobs: tuple, remedy: str, wait: float = 60.0) -> Task:
    """This process's task as the chief (the client) of a cluster of ``tfdp.server``s running
    ``jobs``, each of which must name tasks (else one line ending with ``remedy``); its
    addresses checked (``check_addresses``, waiting up to ``wait`` seconds for names)."""
    task_ = task(kinds=("chief",), program=program)
    for job in jobs:
        if not task_.cluster.get(job):
            raise UserError(f"{ENV} names no {job} tasks: {remedy}")
    check_addresses(task_, wait)
    return task_


def job_peers(task_: Task, jobs: tuple) -> list:
    """``[(name, address)]`` of every task of ``jobs``, job by job: "worker 0", ..., "ps 0"."""
    return [(f"{job} {i}", address) for job in jobs
            for i, address in enumerate(task_.cluster[job])]


def num_workers(environ=None) -> int:
    """Training processes in ``TF_CONFIG`` (0 when it cannot be read: reported later)."""
    try:
        return len(task(environ).workers)
    except UserError:
        return 0


def check_addresses(task_: Task, wait: float = 60.0) -> None:
    """Refuse in one line what TensorFlow would only fail on later: a host of the cluster whose
    name does not resolve within ``wait`` seconds (a typo; TensorFlow would wait the whole
    --collective_timeout and then blame the peers it cannot reach; a peer's name may appear
    late, as a Kubernetes pod's does), and this task's port taken (TensorFlow binds every
    interface and fails with "Could not start gRPC server")."""
    deadline = time.monotonic() + wait
    for job, addresses in task_.cluster.items():
        for index, address in enumerate(addresses):
            host = address.rpartition(":")[0].strip("[]")
            while True:
                try:
                    socket.getaddrinfo(host, None)
                    break
                except (socket.gaierror, UnicodeError) as e:
                    if time.monotonic() >= deadline:
                        raise UserError(
                            f"{ENV}'s {job} {index} ({address}): the host {host!r} does not "
                            f"resolve ({getattr(e, 'strerror', None) or e}; waited {wait:g} "
                            "s): give its address, or a name this machine resolves") from None
                    time.sleep(1.0)
    _check_port_free(task_)


def _check_port_free(task_: Task) -> None:
    if port_taken(task_.address):
        raise UserError(f"port {task_.address.rpartition(':')[2]} of {ENV}'s {task_.type} "
                        f"{task_.index} ({task_.address}) is already in use: stop what holds it "
                        "or give this task another port")


def port_taken(address: str) -> bool:
    """Whether another process listens on ``address``'s port here (``host:port``); a port this
    user may not listen on (below 1024, without root) is a one-line error, as the server's own
    start would be."""
    host, _, port = address.rpartition(":")
    probe = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET)
    # As gRPC binds: connections of an earlier run still in TIME_WAIT do not hold the port.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("", int(port)))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return True
        if e.errno == errno.EACCES:
            raise UserError(f"this user may not listen on port {port} ({address}): ports below "
                            "1024 need root; give a port from 1024 up") from None
        raise
    finally:
        probe.close()
    return False


# How long a peer that TensorFlow reports lost may take to stop accepting connections: a killed
# process's port closes only once its exit is done, and on a loaded machine a large process's
# exit takes a while; until then its port still accepts.
EXIT_SETTLES_S = 3.0


def silent_peers(peers: list, settle: float = 0.0) -> list:
    """``"worker 1 (host:port)"`` for each of ``peers`` that does not accept a connection now,
    or within ``settle`` seconds if every one does at first."""
    deadline = time.monotonic() + settle
    while True:
        silent = unreachable([address for _, address in peers])
        if silent or time.monotonic() >= deadline:
            return [f"{name} ({address})" for name, address in peers if address in silent]
        time.sleep(0.2)


def lost_contact(error_name: str, peers: list, error_text: str, kept_steps: list,
                 hung: list = ()) -> str:
    """The one line for a run that lost its cluster: the ``peers`` it cannot reach now (else
    those that accept a connection but run nothing, ``hung``; else those TensorFlow's
    ``error_text`` names) and the backup the same command resumes from. Where TensorFlow said
    a peer was lost (``error_text``), a peer still exiting is given ``EXIT_SETTLES_S``."""
    named = silent_peers(peers, EXIT_SETTLES_S if error_text else 0.0)
    if not named and hung:
        return (f"lost contact with the cluster ({error_name}): not answering now (its port "
                f"open, its process stopped or hung): "
                + ", ".join(f"{name} ({address})" for name, address in hung)
                + _resume(kept_steps))
    if not named:
        unhealthy = sorted(set(re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", error_text)))
        named = [f"{job} {index} (reported unhealthy)" for job, index in unhealthy]
    return (f"lost contact with the cluster ({error_name}): "
            + (f"unreachable now: {', '.join(named)}" if named else "no peer named")
            + _resume(kept_steps))


def _resume(kept_steps: list) -> str:
    kept = f"; the backup of step {kept_steps[-1]} is kept" if kept_steps else ""
    re_forms = regrouping.launcher_re_forms()
    if re_forms:
        return f"{kept}: {re_forms}"
    return f"{kept}: {errors.rerun()} to resume once every worker is reachable"


def did_not_start(seconds: float, peers: list, start: str = "every worker",
                  flag: str = "--collective_timeout", suggest_longer: bool = True) -> str:
    """The one line for a cluster whose ``peers`` did not all answer within ``seconds``:
    those that never answered, and what to ``start``."""
    named = ", ".join(silent_peers(peers))
    return (f"the cluster did not start within {flag}={seconds:g} s: "
            + (f"never answered: {named}" if named else "every peer listens, but one is stuck")
            + f"; start {start} of {ENV} (python -m tfdp.launch does)"
            + (f" or raise {flag}" if suggest_longer else ""))


def unreachable(addresses: list, timeout: float = 1.0) -> list:
    """The ``host:port`` addresses that do not accept a TCP connection now."""
    return [address for address in addresses if answer(address, timeout) != ACCEPTS]


ACCEPTS, REFUSES, SILENT = "accepts", "refuses", "silent"


def answer(address: str, timeout: float = 1.0) -> str:
    """How ``host:port`` answers a TCP connection now: ``ACCEPTS``; ``REFUSES`` (its host says
    nothing listens there: the process has gone); ``SILENT`` (nothing answers: no route, a link
    down, a machine off, or no reply within ``timeout``)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        return ACCEPTS
    except ConnectionRefusedError:
        return REFUSES
    except (OSError, ValueError):
        return SILENT
