"""The suite's TensorFlow commands forked from a process that has imported TensorFlow already.

A short ``python -m tfdp.train`` spends most of its CPU importing TensorFlow and Keras, and a
whole run of the suite starts some 300 of them (docs/design.md#tests). Each test worker starts
one zygote (``start``; its program is ``tests/zygote_server.py``, its children's set-up
``tests/zygote_child.py``): a process that has imported
what those commands import, then waits on a Unix socket (``$TFDP_TEST_ZYGOTE``). Any ``python -m
tfdp.<command>`` started under a test (by the test, by ``tfdp.launch``, by a command that starts
another), and the ``python -m tf2onnx.convert`` an ONNX export starts, begins as Python always
does, and ``zygote_site/sitecustomize.py``, on its ``PYTHONPATH``, hands the command to the zygote: it forks a child that takes the command's
arguments, environment, working folder, open files, umask, limits, priority, CPU affinity,
signal dispositions and mask, supplementary groups, and network and mount namespaces (where the
zygote may: root), then runs the module as ``python -m`` does.
The process that was started stays as the command's stand-in, under the pid its parent knows:
the signals it is sent go on to the child, the child's stops and continues are mirrored onto it,
and it exits as the child exits (by the same signal where a signal ended the child); killed, it
takes the child with it.

A command under another TensorFlow log threshold (read once, as TensorFlow imports: tfdp's
own, in the tests of what a user's shell shows) goes to a second zygote that imported under
it, started the first time one is asked for (``<socket>-<key>``). What the zygote cannot
reproduce it refuses, and the command then starts as usual: an environment that differs in
anything else read at import (Python's own variables, ``LD_*``, ...), another executable, user or set of capabilities, another cgroup,
pid, user, UTS or IPC namespace, Python options, ``--verbose`` (which shows what
TensorFlow prints while it imports). ``TFDP_TEST_FORK=0`` in a command's
environment (or the suite's) starts it as usual. ``<socket>.log`` says what was forked or why
not; ``running_pid`` gives the child of a stand-in (a test that stops a task stops the child).
"""

import ctypes
import glob
import os
import signal
import subprocess
import sys
import time

SOCKET_ENV = "TFDP_TEST_ZYGOTE"
OFF_ENV = "TFDP_TEST_FORK"
# As zygote_site/sitecustomize.py's, which may import nothing of the suite's.
# tfdp's commands; tf2onnx's converter (an ONNX export starts it); tests/test_zygote.py's probe.
SERVED = ("tfdp.", "tf2onnx.convert", "zygote_probe")
NOT_SERVED = ("tfdp.launch", "tfdp.cluster.watchdog")  # They never import TensorFlow.
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote_site")
_PR_SET_PDEATHSIG = 1
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote_server.py")


# The test worker's side.

def start(folder: str):
    """Start this test worker's zygote, its socket in ``folder``, and have every process
    started from here on hand its command to it (``$TFDP_TEST_ZYGOTE``, ``PYTHONPATH``): the
    zygote's Popen, or None where ``TFDP_TEST_FORK=0``."""
    if os.environ.get(OFF_ENV) == "0":
        return None
    path = os.path.join(folder, "zygote")
    if len(path) > 90:  # A Unix socket's address holds 108 bytes; a variant's adds 9.
        return None
    python_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([SITE, *([python_path] if python_path else [])])
    os.environ[SOCKET_ENV] = path
    env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
    log = open(path + ".log", "a")
    zygote = subprocess.Popen([sys.executable, SERVER, path], env=env,
                              stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                              preexec_fn=die_with_parent)
    log.close()
    deadline = time.time() + 60  # Listening before TensorFlow imports: a command then waits.
    while not os.path.exists(path) and zygote.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    return zygote


def running_pid(pid: int, timeout: float = 60) -> int:
    """The process that runs the command of process ``pid``: the zygote's child where ``pid``
    is its stand-in, else ``pid``. A command still waiting for the zygote's answer is waited
    for (a zygote importing TensorFlow answers seconds later)."""
    deadline = time.time() + timeout
    while True:
        try:
            with open(f"{os.environ[SOCKET_ENV]}.pids/{pid}") as f:
                return int(f.read())
        except (KeyError, OSError, ValueError):
            pass
        if not _may_hand_over(pid) or time.time() > deadline:
            return pid
        time.sleep(0.05)


def _may_hand_over(pid: int) -> bool:
    """Whether process ``pid`` is a ``python -m tfdp.<command>`` that may yet be forked."""
    argv = read_text(f"/proc/{pid}/cmdline").split("\0")
    env = read_text(f"/proc/{pid}/environ").split("\0")
    return (len(argv) > 2 and argv[1] == "-m" and argv[2].startswith(SERVED)
            and argv[2] not in NOT_SERVED and f"{OFF_ENV}=0" not in env
            and any(v.startswith(SOCKET_ENV + "=") for v in env))


def stop(zygote) -> None:
    """End the zygote ``start`` started (its children end with it)."""
    global _stopped
    zygote.terminate()
    zygote.wait(timeout=60)
    _stopped = True


_stopped = False


def children_cpu() -> float:
    """CPU-seconds of the zygotes' children that have ended (a variant's too), until the zygote
    has ended: then they count among this process's own children's (``RUSAGE_CHILDREN``)."""
    if _stopped or SOCKET_ENV not in os.environ:
        return 0.0
    total = 0.0
    for name in glob.glob(glob.escape(os.environ[SOCKET_ENV]) + "*.cpu"):  # Variants' too.
        try:
            with open(name) as f:
                total += float(f.read())
        except (OSError, ValueError):
            pass
    return total


def die_with_parent() -> None:
    """SIGKILL to this process when its parent ends (the zygote's, and each of its children)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
