"""The suite's commands forked from one import (tests/zygote.py) are the commands started as
usual: what a process sees of itself, how it ends and what signals do to it, compared between
a probe (``tests/zygote_probe.py``) forked by this worker's zygote and the same probe started
as usual (``TFDP_TEST_FORK=0``); and what the zygote cannot reproduce starts as usual."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import zygote

from processes import alive, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def a_zygote():
    """After conftest's session fixture has started this worker's zygote, or not."""
    if not os.environ.get(zygote.SOCKET_ENV):
        pytest.skip("no zygote (TFDP_TEST_FORK=0): nothing forked to compare")


def start(what, forked, env=None, **popen):
    env = {**os.environ, "PROBE": "yes", **(env or {}), **({} if forked else {zygote.OFF_ENV: "0"})}
    popen.setdefault("stdout", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "zygote_probe", *what.split()], cwd=HERE, env=env,
                            stdin=popen.pop("stdin", subprocess.DEVNULL),
                            stderr=subprocess.PIPE, text=True, **popen)


def both(what="exit", stdin=None, **popen):
    """(returncode, what the probe saw, its stderr, whether it was forked), forked then not."""
    ends = []
    for forked in (True, False):
        probe = start(what, forked, stdin=subprocess.PIPE if stdin else None, **popen)
        out, err = probe.communicate(stdin, timeout=60)
        ends.append((probe.returncode, json.loads(out.splitlines()[0]) if out else None, err,
                     zygote.running_pid(probe.pid) != probe.pid))
    return ends


def test_a_forked_command_sees_what_a_command_started_as_usual_sees(tmp_path):
    read, write = os.pipe()  # An open file beyond the three a command gets.

    def as_a_launcher_starts_it():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # A shell's background command.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
        os.umask(0o077)
        os.sched_setaffinity(0, {0})
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 1024))

    try:
        forked, usual = both("read", stdin="what the command reads", pass_fds=(write,),
                             preexec_fn=as_a_launcher_starts_it, env={"HOME": os.environ["HOME"]})
    finally:
        os.close(read)
        os.close(write)
    assert forked[3] and not usual[3], "the first was to be forked, the second not"
    assert forked[:3] == usual[:3]
    seen = forked[1]
    assert seen["stdin"] == "what the command reads" and write in seen["fds"]
    assert seen["umask"] == 0o077 and seen["affinity"] == [0] and seen["nofile"] == [512, 1024]
    assert seen["signals"]["SIGINT"] == str(signal.SIG_IGN)
    assert signal.SIGUSR1 in seen["blocked"]
    # What importing TensorFlow sets in a command's environment, the zygote's import set.
    assert seen["env"]["TPU_ML_PLATFORM"] is None or usual[1]["env"]["TPU_ML_PLATFORM"]


@pytest.mark.root("other supplementary groups and a mount namespace of its own")
def test_a_command_with_a_slurm_tasks_groups_and_mounts_sees_them_forked(tmp_path):
    """slurmd gives its tasks root's supplementary groups and, under ``ip netns exec``, a mount
    namespace of its own (its /etc/hosts, its /sys): a command started so, forked, sees what it
    sees started as usual."""
    look = tmp_path / "mounted"
    look.mkdir()
    seen = []
    for forked in (True, False):
        command = ["setpriv", "--groups=4,27", "unshare", "--mount", "sh", "-c",
                   f'mount -t tmpfs tmpfs {look} && touch {look}/only-here && exec "$@"', "sh",
                   sys.executable, "-m", "zygote_probe", "exit"]
        env = {**os.environ, "PROBE_LOOK": str(look), **({} if forked else {zygote.OFF_ENV: "0"})}
        probe = subprocess.Popen(command, cwd=HERE, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        out, err = probe.communicate(timeout=60)
        assert probe.returncode == 7, err
        seen.append(json.loads(out.splitlines()[0]))
        with open(os.environ[zygote.SOCKET_ENV] + ".log") as f:  # Each one execs the next.
            assert (f"forked zygote_probe of {probe.pid} " in f.read()) is forked
    assert seen[0] == seen[1] and seen[0]["groups"] == [4, 27]
    assert seen[0]["looked"] == ["only-here"] and not os.listdir(look)


def test_a_forked_command_on_a_terminal_is_line_buffered_as_one_started_as_usual():
    seen = []
    for forked in (True, False):
        main, terminal = os.openpty()
        probe = start("exit", forked, stdout=terminal)
        os.close(terminal)
        out = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # The terminal's last writer has gone.
                break
            if not chunk:
                break
            out += chunk
        probe.wait(60)
        os.close(main)
        seen.append(json.loads(out.decode().splitlines()[0]))
    assert seen[0] == seen[1] and seen[0]["tty"] == [False, True, False]
    # Line-buffered on a terminal, as Python makes it, unless its output is unbuffered.
    assert seen[0]["buffering"][0] is not bool(os.environ.get("PYTHONUNBUFFERED"))


def test_the_child_ends_as_it_ends_and_signals_reach_it():
    forked, usual = both("die")
    assert forked[3] and forked[0] == usual[0] == -signal.SIGUSR2
    forked, usual = both("exit")
    assert forked[0] == usual[0] == 7

    probe = start("wait", True)
    probe.stdout.readline()
    child = zygote.running_pid(probe.pid)
    assert child != probe.pid
    # Stopped, the child is seen stopped where its parent looks (tfdp.launch reads
    # /proc/<worker>/stat), and continued, running again.
    os.kill(child, signal.SIGSTOP)
    wait_for(lambda: _state(probe.pid) == "T", 10, "the stand-in to show the child's stop")
    os.kill(child, signal.SIGCONT)
    wait_for(lambda: _state(probe.pid) != "T", 10, "the stand-in to show the child running")
    probe.send_signal(signal.SIGTERM)  # To the process its parent started.
    assert probe.wait(30) == 3 and probe.stdout.read() == "terminated\n"
    assert not alive(child)

    probe = start("wait", True)
    probe.stdout.readline()
    child = zygote.running_pid(probe.pid)
    os.kill(child, signal.SIGSTOP)  # Killed while stopped, the child ends: so does its stand-in.
    wait_for(lambda: _state(probe.pid) == "T", 10, "the stand-in to show the child's stop")
    os.kill(child, signal.SIGKILL)
    assert probe.wait(30) == -signal.SIGKILL

    probe = start("wait", True)
    probe.stdout.readline()
    child = zygote.running_pid(probe.pid)
    probe.kill()  # SIGKILL, which no stand-in can pass on: its child goes with it.
    assert probe.wait(30) == -signal.SIGKILL
    wait_for(lambda: not alive(child), 10, "the killed stand-in's child to end")


def test_a_command_started_after_a_stand_in_was_killed_finds_what_its_child_held_free(tmp_path):
    """A process killed has closed its files (a run folder's lock released) once its parent
    sees it end; a killed stand-in's child ends after it, and is gone before the zygote forks
    the next command, however soon that comes (an elastic group's worker started again found
    its folder held)."""
    lock = tmp_path / "lock"
    holder = start(f"hold {lock} 1024", True)
    assert json.loads(holder.stdout.readline()) == {"locked": True}
    holder.stdout.readline()  # Its memory touched: an end that takes a while.
    server = _parent(zygote.running_pid(holder.pid))
    os.kill(server, signal.SIGSTOP)  # The stand-in's end and the next command, seen at once.
    try:
        holder.kill()
        assert holder.wait(30) == -signal.SIGKILL
        again = start(f"hold {lock} 0", True)
        wait_for(lambda: any(read_link(f"/proc/{again.pid}/fd/{fd}").startswith("socket:")
                             for fd in os.listdir(f"/proc/{again.pid}/fd")), 30,
                 "the next command to ask the zygote")
        time.sleep(0.2)  # Connected.
    finally:
        os.kill(server, signal.SIGCONT)
    line = again.stdout.readline()
    again.kill()
    again.wait(30)
    assert json.loads(line) == {"locked": True}


def _parent(pid: int) -> int:
    return int(_stat(pid)[1])


def read_link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def test_what_the_zygote_cannot_reproduce_starts_as_usual():
    probe = start("exit", True, env={"PYTHONHASHSEED": "1" if os.environ.get(
        "PYTHONHASHSEED") != "1" else "0"})  # Read by Python as it starts.
    out, err = probe.communicate(timeout=60)
    assert probe.returncode == 7 and json.loads(out)["name"] == "__main__", err
    assert zygote.running_pid(probe.pid) == probe.pid
    with open(os.environ[zygote.SOCKET_ENV] + ".log") as f:
        assert f"refused zygote_probe of {probe.pid}: its PYTHONHASHSEED differ" in f.read()


def test_a_command_under_another_log_threshold_is_forked_by_a_zygote_imported_under_it():
    """TensorFlow reads its C++ log threshold once, as it imports: a command under another
    (tfdp's own, in the tests of what a user's shell shows) goes to a second zygote, started
    for it, that imported under that one, and the next such command to the same."""
    other = "1" if os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "1" else "0"
    servers = []
    for env in ({}, {"TF_CPP_MIN_LOG_LEVEL": other}, {"TF_CPP_MIN_LOG_LEVEL": other}):
        probe = start("wait", True, env=env)
        assert json.loads(probe.stdout.readline())["name"] == "__main__"
        child = zygote.running_pid(probe.pid)
        assert child != probe.pid, "forked"
        servers.append(_parent(child))
        environ = zygote.read_text(f"/proc/{servers[-1]}/environ").split("\0")
        imported_under = env.get("TF_CPP_MIN_LOG_LEVEL", os.environ["TF_CPP_MIN_LOG_LEVEL"])
        assert f"TF_CPP_MIN_LOG_LEVEL={imported_under}" in environ
        probe.send_signal(signal.SIGTERM)
        assert probe.wait(30) == 3, probe.stderr.read()
    assert servers[0] != servers[1] == servers[2]


def _state(pid: int) -> str:
    return _stat(pid)[0]


def _stat(pid: int) -> list:
    """/proc/<pid>/stat's fields after the command's name: its state, its parent, ..."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def test_the_stand_ins_and_the_zygote_serve_the_same_commands():
    import ast

    with open(os.path.join(zygote.SITE, "sitecustomize.py")) as f:
        site = {target.id: ast.literal_eval(node.value) for node in ast.parse(f.read()).body
                if isinstance(node, ast.Assign) for target in node.targets
                if isinstance(target, ast.Name) and target.id in ("_SERVED", "_NOT_SERVED")}
    assert (site["_SERVED"], site["_NOT_SERVED"]) == (zygote.SERVED, zygote.NOT_SERVED)
