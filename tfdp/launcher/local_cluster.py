"""A local cluster for ``python -m tfdp.launch``, run from start to end: the workers' flags
checked, the network chosen (a private namespace, or emulated hosts), the processes started
(``tfdp.launcher.processes``: what each is), watched (``tfdp.launcher.supervise``) and their lines
copied (``tfdp.launcher.output``); ``tfdp.launch`` is the command line."""

import functools
import os
import signal
import subprocess
import sys
import threading
import time

from tfdp import paths
from tfdp.config import flags
from tfdp.config.settings import RUN_STAMP_ENV
from tfdp.launcher import (elastic, emulated_hosts, isolation, managed_group, regrouping,
                           supervise)
from tfdp.launcher.children import prepare_child
from tfdp.launcher.processes import HOST_PORT, free_ports, processes
from tfdp.launcher.output import pump, roles_of, say, summary
from tfdp.util import errors
from tfdp.util.errors import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, UserError

# Seconds the workers get to save and exit after a SIGTERM before they are killed.
PREEMPT_GRACE = 30.0
POLL_SECONDS = 0.2  # How often the launcher looks at its processes.


def launch(num_workers, train_args: list, isolate: bool = True, hosts: bool = False,
           link: str = None, num_ps: int = None, max_restarts: int = 0,
           managed_task=lambda strategy, num_ps: None) -> int:
    """Run the workers to the end; return 0 if all succeeded, else an exit code: the first
    failure's; ``PREEMPTED_EXIT_CODE`` when SIGTERM or Ctrl-C preempted them and every one saved;
    ``INTERRUPTED_EXIT_CODE`` after a second Ctrl-C, which stops them at once.

    With ``isolate`` this process first moves into a private network namespace (its workers
    inherit it: ``tfdp.launcher.isolation``). With ``hosts`` every worker runs on an emulated
    host of its own, its link shaped to ``link`` (``tfdp.launcher.emulated_hosts``).
    ``num_workers``: a number, or ``"MIN:MAX"``, a group that goes on when workers are lost;
    ``max_restarts``: lost workers started again as the group re-forms
    (``tfdp.launcher.elastic``). ``managed_task(strategy, num_ps)``: this process's task where
    a cluster manager started it (``tfdp.cluster.managed.described``), whose agent it then is
    (``tfdp.launcher.managed_group``); None elsewhere."""
    config, problem = workers_config(train_args)
    asked, (size_range, size_problem) = str(num_workers), elastic.sizes(num_workers)
    problem = problem or size_problem or _check(size_range, hosts, link, config,
                                                asks_help(train_args), num_ps, max_restarts)
    if problem:
        say(f"tfdp.launch: error: {problem}")
        return 2
    as_a_task = managed_group.as_a_task(managed_task, size_range, asked, config, train_args,
                                        hosts, max_restarts)
    if as_a_task is not None:  # A task of a Slurm step or an Indexed Job: its agent.
        return as_a_task
    path = paths.get(config.strategy)
    client = path.cluster == paths.CLIENT
    num_ps = (num_ps or 1) if path.parameter_servers else 0
    num_workers, group = size_range[1], elastic.Group(size_range, max_restarts, asked, client)
    # The client (chief) of the manual and parameter-server paths is a host too.
    count = num_workers + num_ps + client
    stamp, live = time.strftime("%Y%m%d-%H%M%S"), sys.stdout.isatty()
    run_dir = _run_dir(config, stamp)
    procs, copiers, emulated, specs = [], [], None, []
    supervise.SIGNALLED.clear()
    previous = {sig: signal.signal(sig, supervise.on_signal) for sig in supervise.STOP_SIGNALS
                if signal.getsignal(sig) != signal.SIG_IGN}  # SIGHUP under nohup stays ignored.
    if group.fewest < group.most:  # Room to grow, once workers have been lost.
        regrouping.unmark(run_dir)  # What a launcher killed in a join left.
        supervise.JOINING.clear()
        previous[supervise.JOIN_SIGNAL] = signal.signal(supervise.JOIN_SIGNAL, supervise.on_join)
    try:
        if hosts:
            stale = emulated_hosts.remove_stale()
            if stale:
                say(f"tfdp.launch: removed what a killed launcher left: {', '.join(stale)}")
            emulated = emulated_hosts.Hosts(count, link)
            emulated.create()
            addresses = [f"{emulated.address(i)}:{HOST_PORT}" for i in range(count)]
            where = "on emulated hosts"
        else:
            where = _network(isolate)
            addresses = [f"127.0.0.1:{port}" for port in free_ports(count)]
        chief = addresses.pop(0) if client else None
        ps = addresses[num_workers:]
        specs[:] = processes(config, num_workers, train_args, addresses[:num_workers], chief,
                             stamp, live, ps)
        if emulated:
            for line in emulated.describe(roles_of(specs)):
                say(f"tfdp.launch: {line}")
        placed = list(range(len(specs)))  # The emulated host of each process.

        def start(position):
            spec = specs[position]
            proc = subprocess.Popen(
                spec.argv, env=spec.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                # A session of its own: Ctrl-C in the terminal reaches the launcher only, which
                # then asks every worker to save and stop.
                start_new_session=True,
                preexec_fn=functools.partial(prepare_child, spec.cores, os.getpid(), emulated,
                                             placed[position]))
            for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                copier = threading.Thread(target=pump, args=(stream, spec.prefix, out),
                                          daemon=True)
                copier.start()
                copiers.append(copier)
            return proc

        while True:
            group.tell_the_workers(specs)
            procs[:] = [start(host) for host in range(len(specs))]
            say(f"tfdp.launch: {summary(specs)} {where}")
            supervise.raise_if_signalled()
            if client and not group.goes_on:
                restart = start if path.restart_lost_workers else None
                return supervise.supervise_client(procs, specs, POLL_SECONDS, restart)
            ended = _supervise_group(procs, specs, group, client, run_dir,
                                     *_host_checks(emulated, placed))
            roles = [spec.role for spec in specs]
            if ended is None:  # Grown: the workers (or the client) saved one step and stopped.
                if client:  # Its servers stop once it has gone.
                    supervise.stop(procs, roles)
                else:
                    elastic.seed_the_joiner(run_dir, group.size - 1)
            elif isinstance(ended, supervise.ChiefLost):
                say(group.start_the_chief_again(ended.code))
                supervise.stop(procs, roles, grace=0)  # Its servers: no new client reads them.
            elif not isinstance(ended, supervise.Left):
                if ended == 0 and group.departed:
                    elastic.clear_departed(run_dir, group.size)
                return ended
            else:
                for line in group.lose(ended.failed):
                    say(line)
                if not client:  # The client saved already (supervise_client waits for it).
                    lost = {i for i, _ in ended.failed}
                    survivors = [i for i in range(len(procs)) if i not in lost]
                    supervise.wait([procs[i] for i in survivors],
                                   supervise.SURVIVORS_SAVE_WITHIN)
                    elastic.seed_from_the_survivors(run_dir, survivors, group.size)
                # Those still running wait in a collective for the lost worker: nothing to save.
                supervise.stop(procs, roles, grace=0)
            if emulated:  # On the hosts still reachable: one cut off keeps no worker.
                placed[:] = emulated.reachable(placed[:client])[:group.size + client]
                addresses = [f"{emulated.address(h)}:{HOST_PORT}" for h in placed]
            else:
                addresses = [f"127.0.0.1:{port}" for port in free_ports(group.size + client)]
            chief = addresses.pop(0) if client else None
            specs[:] = processes(config, group.size, train_args, addresses, chief, stamp, live)
    except (KeyboardInterrupt, supervise.Terminated) as stop:
        interrupted = isinstance(stop, KeyboardInterrupt)
        say(f"tfdp.launch: {'interrupted' if interrupted else supervise.signalled()}; asking the "
            f"{'chief' if client else 'workers'} to save and stop")
        # The client saves what it reads from the workers or servers: they stay up until it has.
        codes = supervise.preempt(procs[:1] if client else procs, PREEMPT_GRACE)
        if supervise.second_ctrl_c():  # Said last, below, after what the workers said.
            return INTERRUPTED_EXIT_CODE
        if set(codes) == {PREEMPTED_EXIT_CODE}:
            return PREEMPTED_EXIT_CODE
        if set(codes) == {0}:  # They had finished (and exported): nothing was interrupted.
            return 0
        return 128 + (signal.SIGINT if interrupted else signal.SIGTERM)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        supervise.stop(procs, [spec.role for spec in specs],
                       grace=0 if supervise.second_ctrl_c() else 5.0)
        for copier in copiers:
            copier.join(timeout=5)
        if emulated:
            for line in emulated.traffic({h: spec.role for h, spec in zip(placed, specs)}):
                say(f"tfdp.launch: {line}")
            emulated.remove()
        if supervise.second_ctrl_c():
            folder = None if config.workdir else run_dir
            say("tfdp.launch: stopped at once (a second Ctrl-C): the steps since the newest "
                f"backup are lost; {errors.rerun_in(folder)} to resume from it")


def _host_checks(emulated, placed: list) -> tuple:
    """On emulated hosts: which processes' hosts are cut off (their positions), and whether a
    host is free and up for a worker to join; (None, None) elsewhere."""
    if not emulated:
        return None, None
    return ((lambda: [j for j, h in enumerate(placed) if not emulated.up(h)]),
            (lambda: len(emulated.reachable(placed)) > len(placed)))


def _supervise_group(procs, specs, group: elastic.Group, client: bool, run_dir: str,
                     cut=None, host_free=None):
    """The supervision of a group that regroups (``multi_worker``'s workers, or a client's
    servers), which a worker may join (SIGUSR1): the group's exit code, a ``supervise.Left``,
    a ``supervise.ChiefLost`` (while ``--max_restarts`` allows), or None once it has grown
    (every worker, or the client, saved one common step and stopped, as for a preemption, the
    run folder ``run_dir`` marked meanwhile so that their lines say the group re-forms:
    ``tfdp.launcher.regrouping``). On emulated hosts, ``cut()`` names the processes whose
    host's link is down, and ``host_free()`` says whether a joining worker has a host."""
    while True:
        try:
            if client:
                return supervise.supervise_client(procs, specs, POLL_SECONDS,
                                                  going_on=group.survivors_needed(),
                                                  chief_again=group.restarts_left > 0, cut=cut)
            return supervise.supervise(procs, POLL_SECONDS, PREEMPT_GRACE,
                                       going_on=group.survivors_needed(), cut=cut)
        except supervise.Join:
            room, line = group.joining()
            if room and host_free and not host_free():
                room, line = False, ("tfdp.launch: a worker asked to join (SIGUSR1); no "
                                     "emulated host is up and free for it")
            say(line)
            if not room:
                continue
            # The client saves what it reads from its servers: they stay up until it has.
            regrouping.mark(run_dir)
            try:
                codes = supervise.preempt(procs[:1] if client else procs, PREEMPT_GRACE)
            finally:
                regrouping.unmark(run_dir)
            if set(codes) == {PREEMPTED_EXIT_CODE}:
                group.grow()
                return None
            if set(codes) == {0}:  # It had finished.
                return 0
            code = next((c for c in codes if c not in (0, PREEMPTED_EXIT_CODE)), None)
            return 1 if code is None else supervise.exit_status(code)


def _run_dir(config, stamp: str) -> str:
    """The workers' run folder: ``--workdir``, else the default ``worker_env``'s stamp names."""
    return config.workdir or config.default_run_dir(os.environ.get(RUN_STAMP_ENV, stamp))


def workers_config(train_args: list) -> tuple:
    """(the ``Config`` the workers' ``train_args`` make, parsed once here: "" or what is wrong
    with them, in tfdp.train's one line). A request for ``--help`` is left to the workers."""
    from absl.flags import Error

    try:
        return flags.config_from_args([a for a in train_args if a not in _HELP]), ""
    except (UserError, Error) as e:
        return None, str(e)


def asks_help(train_args: list) -> bool:
    return bool(_HELP.intersection(train_args))


def _check(size_range: tuple, hosts: bool, link, config, helping: bool = False,
           num_ps=None, max_restarts: int = 0) -> str:
    """What is wrong with the launcher's own flags given the workers' ``config``, in one line
    ("" if nothing); ``size_range``: ``--num_workers``' (MIN, MAX); ``helping``: the workers are
    asked for their --help only."""
    strategy = config.strategy
    path = paths.get(strategy)
    if path.cluster == paths.NO_CLUSTER and not helping:
        # Each worker would train a run of its own, all in one folder.
        clustered = [p.name for p in paths.all_paths()
                     if p.cluster != paths.NO_CLUSTER]
        return (f"the launcher starts --strategy={paths.either(clustered)} "
                f"clusters; --strategy={strategy} trains in one process: run python -m "
                "tfdp.train instead")
    if num_ps is not None and not path.parameter_servers:
        return (f"--num_ps starts parameter servers for --strategy=parameter_server, not "
                f"--strategy={strategy}")
    if num_ps is not None and num_ps < 1:
        return f"--num_ps must be a positive integer, got {num_ps}"
    if link and not hosts:
        return "--link shapes the links of emulated hosts: give --hosts too"
    if not helping:
        problem = elastic.refusal(*size_range, config, hosts, max_restarts)
        if problem:
            return problem
    try:
        if hosts:
            emulated_hosts.check_available()
        if link:
            emulated_hosts.parse_rate(link)
    except UserError as e:
        return str(e)
    return ""


_HELP = {"-h", "-help", "--help", "--helpshort", "--helpfull"}


def _network(isolate: bool) -> str:
    """Where the workers' servers will listen, said in the launcher's line."""
    if not isolate:
        say("tfdp.launch: warning: --noisolate: the workers' TensorFlow servers listen on every "
            "interface of this machine, without authentication, while they run")
        return "(servers on every interface)"
    ok, how = isolation.private_loopback()
    if ok:
        return f"in {how}"
    say(f"tfdp.launch: warning: cannot isolate the workers ({how}): their TensorFlow servers "
        "listen on every interface of this machine, without authentication, while they run")
    return "(not isolated)"
