"""``python -m tfdp.launch --num_workers=N -- <train flags>``: a local cluster on 127.0.0.1.

Moves itself into a private network namespace with loopback only (``tfdp.cluster.isolation``; the
workers inherit it, so their servers are unreachable from outside), picks ports, starts the
cluster's processes with their ``TF_CONFIG``, pins the workers to their shares of the CPU
cores, prefixes each process's output, and waits. What it starts depends on the strategy:

* ``--strategy=multi_worker``: N ``python -m tfdp.train`` workers, prefixed ``[i]``; only the
  chief (worker 0) prints the per-epoch report and the final line.
* ``--strategy=manual``: N ``python -m tfdp.server`` workers (``[i]``) and one ``python -m
  tfdp.train`` client, the chief (``[chief]``), which trains the from-scratch path on the
  workers' devices (``--num_gpus`` each; ``tfdp.manual.remote``). The client's exit decides.
* ``--strategy=parameter_server``: N ``python -m tfdp.server`` workers (``[i]``), ``--num_ps``
  parameter servers (``tfdp.server`` too, ``[ps j]``) and the coordinator, the chief
  (``[chief]``; ``tfdp.parameter_server.trainer``). The chief's exit decides; a worker that
  dies while it runs is started again (TensorFlow's coordinator retries its steps on the others
  meanwhile, and it rejoins), up to ``RESTARTS`` times.

Faults: if a worker fails, the others are stopped and the launcher exits with its code. SIGTERM
or Ctrl-C to the launcher, or SIGTERM to any worker, is a preemption: every worker saves the
same step and exits with ``PREEMPTED_EXIT_CODE`` (75), and the same command resumes. Workers die
with the launcher whatever kills it (``PR_SET_PDEATHSIG``).

With ``--hosts`` (Linux, root) every worker runs on an emulated host of its own instead,
with ``--link`` the rate of every host's link (``tfdp.cluster.emulated_hosts``).

  python -m tfdp.launch --num_workers=2 -- --strategy=multi_worker --epochs=3
  python -m tfdp.launch --num_workers=3 --hosts --link=100mbit -- --strategy=multi_worker
  python -m tfdp.launch --num_workers=2 --hosts --link=1gbit -- --strategy=manual --allreduce=ring
  python -m tfdp.launch --num_workers=2 --num_ps=2 -- --strategy=parameter_server --ps_shards=2
"""

import codecs
import dataclasses
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import app, flags

from tfdp.cluster import emulated_hosts
from tfdp.cluster import isolation
from tfdp.cluster.children import prepare_child
from tfdp.config import LIVE_PROGRESS_ENV, RUN_STAMP_ENV
from tfdp.errors import PREEMPTED_EXIT_CODE, UserError

flags.DEFINE_integer("num_workers", 2, "Workers to start on this machine: tfdp.train processes "
                     "(multi_worker), or tfdp.server processes for one tfdp.train client (manual, "
                     "parameter_server).")
flags.DEFINE_integer("num_ps", None, "--strategy=parameter_server: parameter servers to start "
                     "(tfdp.server ps tasks; default 1).")
flags.DEFINE_boolean("isolate", True, "Run the workers in a private network namespace (loopback "
                     "only), so their unauthenticated TensorFlow servers are unreachable from "
                     "outside; --noisolate leaves them on every interface.")
flags.DEFINE_boolean("hosts", False, "Run every worker on an emulated host of its own: a network "
                     "namespace with its own address, joined to the others by a switch (Linux, "
                     "root). Everything made is removed on exit.")
flags.DEFINE_string("link", None, "With --hosts: every host's link rate, both directions, in tc "
                    "syntax (10mbit, 100mbit, 1gbit); default unshaped.")
FLAGS = flags.FLAGS
# Seconds the workers get to save and exit after a SIGTERM before they are killed.
PREEMPT_GRACE = 30.0
HOST_PORT = 2222  # Each emulated host has its own address, so every worker can use one port.
# How often one parameter-server worker is started again after dying while its chief runs.
RESTARTS = 3
# The strategies whose cluster is tfdp.server tasks and one tfdp.train client, the chief.
CLIENT_STRATEGIES = ("manual", "parameter_server")


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
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
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


def processes(strategy: str, num_workers: int, train_args: list, addresses: list,
              chief: str, stamp: str, live: bool, ps: list = ()) -> list:
    """The processes of the cluster ``strategy`` needs, the one that reports first."""
    shares = core_shares(num_workers, sorted(os.sched_getaffinity(0)))
    train = [sys.executable, "-m", "tfdp.train", *train_args]
    if strategy == "multi_worker":
        return [Process(f"worker {i}", train, worker_env(i, addresses, stamp, live), shares[i],
                        f"[{i}] ") for i in range(num_workers)]
    server = [sys.executable, "-m", "tfdp.server", *_server_flags(train_args)]
    # The client only sends indices and reads scalars, and a parameter server applies updates:
    # they share every core.
    return [Process("chief", train, worker_env(0, addresses, stamp, live, chief, "chief", ps),
                    None, "[chief] ")] + [
        Process(f"worker {i}", server, worker_env(i, addresses, stamp, live, chief, ps=ps),
                shares[i], f"[{i}] ") for i in range(num_workers)] + [
        Process(f"ps {j}", server, worker_env(j, addresses, stamp, live, chief, "ps", ps), None,
                f"[ps {j}] ") for j in range(len(ps))]


def _server_flags(train_args: list) -> list:
    """The train flags a ``tfdp.server`` shares with its client: its devices and its data."""
    shared = []
    for name in ("num_gpus", "data_dir", "manual_dir"):
        value = _train_flag(train_args, name)
        if value is not None:
            shared.append(f"--{name}={value}")
    verbose = _train_flag(train_args, "verbose")
    if verbose is not None:
        shared.append(f"--verbose={verbose}")
    return shared


_OUTPUT = threading.Lock()


def _say(line: str) -> None:
    """One line of the launcher's own on stderr, in a single write (``print`` makes two, and a
    worker's output could land between them)."""
    with _OUTPUT:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _pump(stream, prefix, out):
    """Copy a worker's output as it comes, with ``prefix`` at the start of every line and after
    every carriage return (a progress bar redraws without a newline). Only whole lines (or
    redraws) go out, each under the output lock, so the lines of two workers never mix."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in iter(lambda: os.read(stream.fileno(), 4096), b""):
        pending += decoder.decode(chunk)
        cut = max(pending.rfind("\n"), pending.rfind("\r")) + 1
        if cut:
            _emit(pending[:cut], prefix, out)
            pending = pending[cut:]
    pending += decoder.decode(b"", final=True)
    if pending:  # A last line without a newline.
        _emit(pending, prefix, out)


def _emit(text, prefix, out):
    pieces, at_line_start = [], True
    for char in text:
        if at_line_start and char not in "\r\n":
            pieces.append(prefix)
            at_line_start = False
        pieces.append(char)
        if char in "\r\n":
            at_line_start = True
    with _OUTPUT:
        out.write("".join(pieces))
        out.flush()


def launch(num_workers: int, train_args: list, poll_seconds: float = 0.2,
           isolate: bool = True, grace: float = PREEMPT_GRACE, hosts: bool = False,
           link: str = None, num_ps: int = None) -> int:
    """Run the workers to the end; return 0 if all succeeded, else an exit code: the first
    failure's, ``PREEMPTED_EXIT_CODE`` when they were preempted and saved, 130 after Ctrl-C.

    With ``isolate`` this process first moves into a private network namespace (its workers
    inherit it: ``tfdp.cluster.isolation``). With ``hosts`` every worker runs on an emulated host of
    its own, its link shaped to ``link`` (``tfdp.cluster.emulated_hosts``)."""
    problem = _check(num_workers, hosts, link, train_args, num_ps)
    if problem:
        _say(f"tfdp.launch: error: {problem}")
        return 2
    strategy = _strategy(train_args)
    num_ps = (num_ps or 1) if strategy == "parameter_server" else 0
    # The client (chief) of the manual and parameter-server paths is a host too.
    count = num_workers + num_ps + (strategy in CLIENT_STRATEGIES)
    stamp, live = time.strftime("%Y%m%d-%H%M%S"), sys.stdout.isatty()
    procs, pumps, emulated, specs = [], [], None, []
    _SIGNALLED.clear()
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if hosts:
            stale = emulated_hosts.remove_stale()
            if stale:
                _say(f"tfdp.launch: removed what a killed launcher left: {', '.join(stale)}")
            emulated = emulated_hosts.Hosts(count, link)
            emulated.create()
            addresses = [f"{emulated.address(i)}:{HOST_PORT}" for i in range(count)]
            where = "on emulated hosts"
        else:
            where = _network(isolate)
            addresses = [f"127.0.0.1:{port}" for port in free_ports(count)]
        chief = addresses.pop(0) if strategy in CLIENT_STRATEGIES else None
        ps = addresses[num_workers:]
        specs = processes(strategy, num_workers, train_args, addresses[:num_workers], chief,
                          stamp, live, ps)
        if emulated:
            for line in emulated.describe(_roles(specs)):
                _say(f"tfdp.launch: {line}")

        def start(host):
            spec = specs[host]
            proc = subprocess.Popen(
                spec.argv, env=spec.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                # A session of its own: Ctrl-C in the terminal reaches the launcher only, which
                # then asks every worker to save and stop.
                start_new_session=True,
                preexec_fn=functools.partial(prepare_child, spec.cores, os.getpid(), emulated,
                                             host))
            for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                pump = threading.Thread(target=_pump, args=(stream, spec.prefix, out),
                                        daemon=True)
                pump.start()
                pumps.append(pump)
            return proc

        for host in range(len(specs)):
            procs.append(start(host))
        _say(f"tfdp.launch: {_summary(specs)} {where}")
        _raise_if_signalled()
        if strategy in CLIENT_STRATEGIES:
            restart = start if strategy == "parameter_server" else None
            return _supervise_client(procs, specs, poll_seconds, restart)
        return _supervise(procs, poll_seconds, grace)
    except (KeyboardInterrupt, _Terminated) as stop:
        interrupted = isinstance(stop, KeyboardInterrupt)
        client = strategy in CLIENT_STRATEGIES
        _say(f"tfdp.launch: {'interrupted' if interrupted else 'SIGTERM'}; asking the "
             f"{'chief' if client else 'workers'} to save and stop")
        # The client saves what it reads from the workers or servers: they stay up until it has.
        codes = _preempt(procs[:1] if client else procs, grace)
        if interrupted:
            return 130
        return PREEMPTED_EXIT_CODE if set(codes) == {PREEMPTED_EXIT_CODE} else 128 + 15
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop(procs, [spec.role for spec in specs])
        for pump in pumps:
            pump.join(timeout=5)
        if emulated:
            for line in emulated.traffic([spec.role for spec in specs]):
                _say(f"tfdp.launch: {line}")
            emulated.remove()


def _roles(specs: list) -> list:
    """What each process is, naming its program where the cluster runs more than one."""
    if len({spec.argv[2] for spec in specs}) == 1:
        return [spec.role for spec in specs]
    return [f"{spec.role} ({spec.argv[2]})" for spec in specs]


def _summary(specs: list) -> str:
    """Who runs where: ``2 workers at a, b, cores [[0], [1]]`` (and the client paths' chief,
    and parameter servers)."""
    workers = [s for s in specs if s.role.startswith("worker")]
    chief = [s for s in specs if s.role == "chief"]
    ps = [s for s in specs if s.role.startswith("ps")]
    line = (f"{len(workers)} {'tfdp.server ' if chief else ''}workers at "
            f"{', '.join(_address(s) for s in workers)}")
    if ps:
        line += f", {len(ps)} parameter server(s) at {', '.join(_address(s) for s in ps)}"
    if chief:
        line += f" and their chief (tfdp.train) at {_address(chief[0])}"
    return line + f", cores {[s.cores for s in workers]}"


def _address(spec: Process) -> str:
    config = json.loads(spec.env["TF_CONFIG"])
    return config["cluster"][config["task"]["type"]][config["task"]["index"]]


def _check(num_workers: int, hosts: bool, link, train_args: list, num_ps=None) -> str:
    """What is wrong with the launcher's own flags, in one line ("" if nothing)."""
    if num_workers < 1:
        return f"--num_workers must be a positive integer, got {num_workers}"
    strategy = _strategy(train_args)
    if (strategy not in ("multi_worker", *CLIENT_STRATEGIES)
            and not _HELP.intersection(train_args)):
        # Each worker would train a run of its own, all in one folder.
        return (f"the launcher starts --strategy=multi_worker, manual or parameter_server "
                f"clusters; --strategy={strategy} trains in one process: run python -m "
                "tfdp.train instead")
    if num_ps is not None and strategy != "parameter_server":
        return (f"--num_ps starts parameter servers for --strategy=parameter_server, not "
                f"--strategy={strategy}")
    if num_ps is not None and num_ps < 1:
        return f"--num_ps must be a positive integer, got {num_ps}"
    if link and not hosts:
        return "--link shapes the links of emulated hosts: give --hosts too"
    try:
        if hosts:
            emulated_hosts.check_available()
        if link:
            emulated_hosts.parse_rate(link)
    except UserError as e:
        return str(e)
    return ""


_HELP = {"-h", "-help", "--help", "--helpshort", "--helpfull"}


def _strategy(train_args: list) -> str:
    """The --strategy the workers will run (tfdp.train's default when not given)."""
    return _train_flag(train_args, "strategy") or "manual"


def _train_flag(train_args: list, name: str):
    """The last value ``train_args`` give flag ``name`` (``--name=v``, ``--name v``; for a
    boolean ``--name``/``--noname``: "true"/"false"), or None."""
    value = None
    for i, arg in enumerate(train_args):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}":
            following = train_args[i + 1] if i + 1 < len(train_args) else ""
            value = following if following and not following.startswith("-") else "true"
        elif arg == f"--no{name}":
            value = "false"
    return value


def _network(isolate: bool) -> str:
    """Where the workers' servers will listen, said in the launcher's line."""
    if not isolate:
        _say("tfdp.launch: warning: --noisolate: the workers' TensorFlow servers listen on every "
             "interface of this machine, without authentication, while they run")
        return "(servers on every interface)"
    ok, how = isolation.private_loopback()
    if ok:
        return f"in {how}"
    _say(f"tfdp.launch: warning: cannot isolate the workers ({how}): their TensorFlow servers "
         "listen on every interface of this machine, without authentication, while they run")
    return "(not isolated)"


class _Terminated(Exception):
    pass


# The signal handlers only note the signal; the supervising loops raise at a point of their
# choosing. An exception raised by a handler can land inside Popen.poll() between its taking
# Popen's internal wait lock and the try that releases it: the lock stays taken, and the later
# wait() for that worker blocks forever (seen in CI with py-spy: the launcher in Popen._wait,
# its chief a zombie nobody reaped).
_SIGNALLED = []


def _on_signal(signum, frame):
    _SIGNALLED.append(signum)


def _raise_if_signalled():
    if signal.SIGINT in _SIGNALLED:
        raise KeyboardInterrupt()
    if _SIGNALLED:
        raise _Terminated()


def _supervise(procs, poll_seconds, grace) -> int:
    while True:
        _raise_if_signalled()
        codes = [p.poll() for p in procs]  # Poll every worker, each time round.
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            i, code = failed[0]
            if code == PREEMPTED_EXIT_CODE:  # The others stop at the same step on their own.
                _say(f"tfdp.launch: worker {i} was preempted; waiting for the others to save")
                codes = _wait(procs, grace)
                return (PREEMPTED_EXIT_CODE if set(codes) == {PREEMPTED_EXIT_CODE}
                        else next(c for c in codes if c != PREEMPTED_EXIT_CODE) or 1)
            _say(f"tfdp.launch: worker {i} exited with {code}; stopping the others")
            return code if code > 0 else 128 - code  # Killed by signal N: 128 + N.
        if all(c == 0 for c in codes):
            return 0
        time.sleep(poll_seconds)


def _supervise_client(procs, specs, poll_seconds, restart=None) -> int:
    """The manual and parameter-server paths: the client (``procs[0]``) decides; a server that
    ends first is said once (the client finds out and says what it means for the run). With
    ``restart`` (``restart(i) -> Popen``), a worker that ends is started again instead, up to
    ``RESTARTS`` times each."""
    reported, restarts = set(), {}
    while True:
        _raise_if_signalled()
        code = procs[0].poll()
        for i, proc in enumerate(procs[1:], 1):  # Before the chief's end: it may be why.
            if i in reported or proc.poll() is None or code is not None:
                continue
            role = specs[i].role
            if restart and role.startswith("worker") and restarts.get(i, 0) < RESTARTS:
                restarts[i] = restarts.get(i, 0) + 1
                _say(f"tfdp.launch: {role} exited with {proc.returncode} while the chief runs; "
                     f"starting it again ({restarts[i]}/{RESTARTS}): the coordinator retries "
                     "its steps on the other workers meanwhile")
                procs[i] = restart(i)
                continue
            reported.add(i)
            _say(f"tfdp.launch: {role} exited with {proc.returncode} while the chief runs")
        if code is not None:
            if code not in (0, PREEMPTED_EXIT_CODE):
                _say(f"tfdp.launch: the chief exited with {code}; stopping the workers")
            return code if code >= 0 else 128 - code
        time.sleep(poll_seconds)


def _preempt(procs, grace) -> list:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    return _wait(procs, grace)


def _wait(procs, grace) -> list:
    """Exit codes, waiting up to ``grace`` seconds in all (None for a worker still running)."""
    deadline = time.time() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    return [p.poll() for p in procs]


def _stop(procs, roles, grace: float = 5.0):
    """SIGTERM every process still running, SIGKILL those alive ``grace`` seconds later."""
    for i, code in enumerate(_preempt(procs, grace)):
        if code is None:
            _say(f"tfdp.launch: {roles[i]} did not stop; killing it")
            procs[i].kill()
            procs[i].wait()


def main(argv):
    sys.exit(launch(FLAGS.num_workers, argv[1:], isolate=FLAGS.isolate, hosts=FLAGS.hosts,
                    link=FLAGS.link, num_ps=FLAGS.num_ps))


def run():
    # Everything after "--" goes to the workers untouched.
    app.run(main, flags_parser=_parse)


def _parse(argv):
    if "--" in argv:
        split = argv.index("--")
        own, rest = argv[:split], argv[split + 1:]
    else:
        own, rest = argv, []
    return FLAGS(own) + rest


if __name__ == "__main__":
    run()
