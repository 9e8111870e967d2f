"""Real processes for the tests: a child's environment, ``python -m`` a module, a launched
cluster and its tasks (found by their ``TF_CONFIG``), and faults from outside them: a task
slowed then stopped by real signals, an emulated host's link cut."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import zygote

from conftest import REPO


def name_hosts(hosts, names: str) -> None:
    """Every emulated host (``tfdp.launcher.emulated_hosts.Hosts``) resolves ``names`` (lines
    of /etc/hosts) as a cluster's DNS would: ``ip netns exec`` puts /etc/netns/<namespace>/hosts
    in place of /etc/hosts. ``unname_hosts`` removes them."""
    for name in hosts.names:
        os.makedirs(f"/etc/netns/{name}", exist_ok=True)
        with open(f"/etc/netns/{name}/hosts", "w") as f:
            f.write("127.0.0.1 localhost\n" + names)


def unname_hosts(hosts) -> None:
    for name in hosts.names:
        shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


# TensorFlow's C++ log threshold left to tfdp, as in a user's shell (tfdp counts an empty value
# as unset): for the tests of what a user sees, e.g. env=AS_FROM_A_SHELL or child_env(**it).
AS_FROM_A_SHELL = {"TF_CPP_MIN_LOG_LEVEL": ""}


def child_env(**extra) -> dict:
    """The environment of a process a test starts: this one's, TensorFlow's C++ INFO hidden."""
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


def run_module(module, *args, env=None, timeout=600, cwd=None):
    """Run ``python -m module args`` in a fresh process; return the CompletedProcess."""
    full_env = dict(os.environ, **(env or {}))
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd or REPO)


def train_in_this_process(argv: list):
    """``python -m tfdp.train`` + ``argv[1:]`` in this process: the flags parsed as the command
    line parses them, into flag values of their own (never absl's global ones, which other
    commands' modules define flags in), then ``tfdp.train.train_from_flags`` (what it prints
    goes to this process's stdout and stderr): its exit code, or None when it returned."""
    from absl import flags as absl_flags

    from tfdp import train
    from tfdp.config import flags

    values = absl_flags.FlagValues()
    flags.define_flags(values)
    values(argv)
    # The command ignores signals once a run has exported, until its process exits: the
    # fixture conftest.signals_as_a_shell_gives_them gives every test them back.
    try:
        train.train_from_flags(values)
    except SystemExit as e:
        return e.code
    return None


def launch(folder, strategy, *train_args, launcher=("--num_workers=2",), popen=False,
           timeout=300, stderr=subprocess.PIPE, env=None):
    """``python -m tfdp.launch <launcher> -- --strategy=<strategy> --workdir=<folder>/run
    --export_dir=<folder>/export <train_args>``: finished (a CompletedProcess), or running
    (``popen``: a Popen with its output piped; ``stderr=subprocess.STDOUT`` merges it).
    ``env``: variables to add to the launcher's environment."""
    args = [sys.executable, "-m", "tfdp.launch", *launcher, "--", f"--strategy={strategy}",
            f"--workdir={folder / 'run'}", f"--export_dir={folder / 'export'}", *train_args]
    environment = child_env(**(env or {}))
    if popen:  # Its signals as a terminal's foreground command has them.
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env=environment, cwd=REPO, preexec_fn=signals_as_in_a_terminal)
    return subprocess.run(args, capture_output=True, text=True, env=environment, cwd=REPO,
                          timeout=timeout)


def signals_as_in_a_terminal() -> None:
    """In a child before it runs its program: SIGHUP, SIGINT and SIGTERM at their default
    actions, as a shell gives a command it runs in the foreground of a terminal. The suite's
    own processes may have them ignored (a suite started by nohup, or in the background of a
    script, whose shell ignores SIGINT for it), and tfdp.launch leaves an ignored signal
    ignored, as such a shell asks: a Ctrl-C, or a SIGINT the test sends, then did nothing (seen
    in whole runs started in the background)."""
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not exited, nor a zombie its parent has yet to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # Gone before the open, or between it and
        return False  # the read (ESRCH: reaped meanwhile).


def children(pid) -> list:
    """The pids of process ``pid``'s children (none once it has gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return []


def backed_up_steps(run_dir, workers: int = 1) -> set:
    """The global steps that every one of ``workers`` (the tasks that keep backups) has a
    backup of in ``run_dir``: a backup file is there once whole (renamed into place)."""
    from tfdp.training.backups import Backups

    return set.intersection(*(set(Backups(str(run_dir), i, {}).steps())
                              for i in range(workers)))


def backed_up(run_dir, workers: int = 1) -> int:
    """The newest of ``backed_up_steps``, 0 for none."""
    return max(backed_up_steps(run_dir, workers), default=0)


def wait_for_first_backup(run, tmp_path, timeout=180, step=1, workers=1):
    """Until the run in ``tmp_path / "run"`` has saved its first backup (an epoch's end), or
    one of global step ``step`` or later, on each of ``workers``."""
    deadline = time.time() + timeout
    while (backed_up(tmp_path / "run", workers) < step and run.poll() is None
           and time.time() < deadline):
        time.sleep(0.05)
    assert backed_up(tmp_path / "run", workers) >= step, f"no backup of step {step} in time"


def left_behind() -> list:
    """Emulated hosts whose maker has gone: what a run left. (Another test process's hosts, in
    use while this one runs, are not this test's to judge.)"""
    from tfdp.launcher import emulated_hosts

    return emulated_hosts.stale()


def cut_off(launcher: int, host: int) -> tuple:
    """Set the link of the launcher's emulated host ``host`` down, its processes left alive:
    (the host's namespace, when)."""
    from tfdp.launcher import emulated_hosts

    name = f"{emulated_hosts.PREFIX}{launcher}-h{host}"
    subprocess.run(["ip", "-n", name, "link", "set", "eth0", "down"], check=True)
    return name, time.time()


def task_pid(launcher: int, kind: str, index: int) -> int:
    """The pid of the process that runs task ``kind`` ``index`` of a launcher (``tasks``)."""
    running = tasks(launcher)
    if (kind, index) not in running:
        raise AssertionError(f"no {kind} {index} among {children(launcher)}")
    return running[kind, index]


def tasks(launcher: int) -> dict:
    """(kind, index) -> the pid of the process that runs that task of a launcher: its child of
    that TF_CONFIG or, where the child stands in for a command the suite forked
    (tests/zygote.py), the forked process, which a stop must reach."""
    running = {}
    for pid in children(launcher):
        config = tf_config_of(pid)
        if config:
            running[config["task"]["type"], config["task"]["index"]] = zygote.running_pid(pid)
    return running


def slow_then_stop(run, folder, kind: str, index: int, epochs: int = 1) -> tuple:
    """Task ``kind`` ``index`` of a launched ``run`` stopped 45 of every 50 ms (real SIGSTOP and
    SIGCONT from outside: a host with a tenth of a CPU) through ``epochs`` epochs from the
    second (from its first backup to ``epochs`` backups later), then stopped for good: hung,
    alive, never answering. The run's (stdout, stderr) once it has ended."""
    from tfdp.training.backups import Backups

    task = None
    try:
        deadline = time.time() + 60
        while task is None and time.time() < deadline:
            try:
                task = task_pid(run.pid, kind, index)
            except AssertionError:
                time.sleep(0.1)
        # From the first epoch's end, not before: its steps and evaluation are compiled then.
        # A compilation at a tenth of a CPU, on a machine that another test may load too,
        # can outlast the run's --collective_timeout: a stall, not a straggler.
        backups = Backups(str(folder / "run"), 0, {})
        while not backups.steps() and run.poll() is None and time.time() < deadline + 120:
            time.sleep(0.05)
        seen = {max(backups.steps(), default=0)}
        while (len(seen) <= epochs and run.poll() is None
               and time.time() < deadline + 240):
            try:
                os.kill(task, signal.SIGSTOP)
                time.sleep(0.045)
                os.kill(task, signal.SIGCONT)
                time.sleep(0.005)
                seen.add(max(backups.steps(), default=0))
            except ProcessLookupError:  # Gone before its backup: the run's lines say why.
                return run.communicate(timeout=120)
        os.kill(task, signal.SIGSTOP)
        return run.communicate(timeout=120)
    finally:
        if task:
            try:
                os.kill(task, signal.SIGCONT)
            except ProcessLookupError:
                pass  # Stopped by the launcher, with the rest of the cluster.


def tf_config_of(pid: int):
    """Process ``pid``'s TF_CONFIG, or None: gone, or between fork and exec (a launched child
    then still has the launcher's environment, without its TF_CONFIG)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
    except OSError:
        return None
    return json.loads(env[b"TF_CONFIG"]) if b"TF_CONFIG" in env else None


def train_command(data_dir, folder, *flags):
    """``python -m tfdp.train`` on ``data_dir``, its run and export folders in ``folder``."""
    return [sys.executable, "-m", "tfdp.train", f"--data_dir={data_dir}",
            f"--workdir={folder / 'run'}", f"--export_dir={folder / 'export'}", *flags]


def run_train(command, cwd=REPO):
    return subprocess.run(command, capture_output=True, text=True, env=child_env(), cwd=cwd,
                          timeout=300)


def wait_for(predicate, seconds, what):
    """Until ``predicate()`` holds; fail naming ``what`` after ``seconds``."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")
