"""The processes of a local cluster (``tfdp.launch``): what each runs (``tfdp.train`` workers,
or a ``tfdp.train`` client with ``tfdp.server`` workers and parameter servers), its
``TF_CONFIG``, its environment, the cores it may use, and the ports they listen on."""

import dataclasses
import json
import os
import socket
import sys

from tfdp import paths
from tfdp.config import flags
from tfdp.config.settings import LIVE_PROGRESS_ENV, RUN_STAMP_ENV

HOST_PORT = 2222  # Each emulated host has its own address, so every worker can use one port.


def free_ports(count: int) -> list:
    """Ports the kernel hands out on 127.0.0.1 (held open together so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def core_shares(num_workers: int, cores: list) -> list:
    """Split the cores among the workers (round robin when there are more workers than cores)."""
    if num_workers >= len(cores):
        return [[cores[i % len(cores)]] for i in range(num_workers)]
    per = len(cores) // num_workers
    return [cores[i * per:(i + 1) * per] for i in range(num_workers)]


def worker_env(index: int, addresses: list, run_stamp: str, live_progress: bool,
               chief: str = None, kind: str = "worker", ps: list = ()) -> dict:
    """The environment of task ``index`` of type ``kind`` (worker, chief or ps) of a cluster of
    workers at ``addresses`` and, for the manual and parameter-server paths, a chief at
    ``chief`` (and parameter servers at ``ps``)."""
    cluster = {"worker": list(addresses), **({"chief": [chief]} if chief else {}),
               **({"ps": list(ps)} if ps else {})}
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster,
                                                 "task": {"type": kind, "index": index}}))
    env.setdefault(RUN_STAMP_ENV, run_stamp)  # One default run folder for all workers.
    reports = kind == "chief" or (index == 0 and not chief)
    if live_progress and reports:  # The chief's bar, when the launcher is in a terminal.
        env[LIVE_PROGRESS_ENV] = "1"
    return env


@dataclasses.dataclass
class Process:
    """One process of the local cluster: its role (``worker 1``), command, environment, the
    cores it may use (None: all), and the prefix of its output lines."""
    role: str
    argv: list
    env: dict
    cores: list
    prefix: str


def processes(config, num_workers: int, train_args: list, addresses: list,
              chief: str, stamp: str, live: bool, ps: list = ()) -> list:
    """The processes of the cluster ``config`` (the workers' ``train_args`` parsed) needs, the
    one that reports first."""
    shares = core_shares(num_workers, sorted(os.sched_getaffinity(0)))
    train = [sys.executable, "-m", "tfdp.train", *train_args]
    if paths.get(config.strategy).cluster == paths.WORKERS:
        return [Process(f"worker {i}", train, worker_env(i, addresses, stamp, live), shares[i],
                        f"[{i}] ") for i in range(num_workers)]
    server = [sys.executable, "-m", "tfdp.server", *flags.server_args(config)]
    # The client only sends indices and reads scalars, and a parameter server applies updates:
    # they share every core.
    return [Process("chief", train, worker_env(0, addresses, stamp, live, chief, "chief", ps),
                    None, "[chief] ")] + [
        Process(f"worker {i}", server, worker_env(i, addresses, stamp, live, chief, ps=ps),
                shares[i], f"[{i}] ") for i in range(num_workers)] + [
        Process(f"ps {j}", server, worker_env(j, addresses, stamp, live, chief, "ps", ps), None,
                f"[ps {j}] ") for j in range(len(ps))]
