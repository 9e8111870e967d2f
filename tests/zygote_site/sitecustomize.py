"""A ``python -m tfdp.<command>`` (or tf2onnx's converter) started under the suite hands its
command to its test worker's zygote (tests/zygote.py says what and why) and stays as the
command's stand-in; any other Python, and a command the zygote refuses, goes on as usual. Then
the site customization that this one shadows on ``sys.path`` (Debian's, for one) runs as it
would have."""

import os
import sys

# tfdp's commands; tf2onnx's converter (an ONNX export starts it); tests/test_zygote.py's probe.
_SERVED = ("tfdp.", "tf2onnx.convert", "zygote_probe")
_NOT_SERVED = ("tfdp.launch", "tfdp.cluster.watchdog")  # They never import TensorFlow.
_FORWARDED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM",
              "SIGCONT", "SIGWINCH", "SIGTSTP")


def _hand_over() -> None:
    path = os.environ.get("TFDP_TEST_ZYGOTE")
    argv = getattr(sys, "orig_argv", [])
    if (not path or os.environ.get("TFDP_TEST_FORK") == "0" or len(argv) < 3
            or argv[1] != "-m" or not argv[2].startswith(_SERVED) or argv[2] in _NOT_SERVED):
        return
    import array
    import json
    import resource
    import signal
    import socket
    import struct

    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))  # Not the listing's own, closed by now.
            fds.append(int(name))
        except OSError:
            pass
    umask = os.umask(0)
    os.umask(umask)
    request = {
        "module": argv[2], "argv": argv, "executable": sys.executable, "env": dict(os.environ),
        "cwd": os.getcwd(), "tfdp": _tfdp_origin(), "fds": fds, "umask": umask,
        "affinity": sorted(os.sched_getaffinity(0)),
        "priority": os.getpriority(os.PRIO_PROCESS, 0),
        "rlimits": {name: resource.getrlimit(getattr(resource, name))
                    for name in dir(resource) if name.startswith("RLIMIT_")},
        "ignored": [int(s) for s in signal.valid_signals()
                    if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE, signal.SIGXFSZ)
                    and _ignored(signal, s)],
        "blocked": [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])],
    }
    body = json.dumps(request).encode()
    # Held from here: the child's, once it runs (waited for below, with their sender).
    forwarded = {getattr(signal, name) for name in _FORWARDED}
    forwarded = {signum for signum in forwarded if not _ignored(signal, signum)}
    signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)
    served_by = path
    for _ in range(2):  # Sent on once at most: to the zygote that imported under its variables.
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(served_by)
            connection.sendmsg([struct.pack("!I", len(body))],
                               [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            connection.sendall(body)
            replies = connection.makefile("rb")
            answer = json.loads(replies.readline() or b'{"exec": "no answer"}')
        except (OSError, ValueError):
            answer = {"exec": "no zygote"}  # Gone, or this worker's session over.
        if "redirect" not in answer:
            break
        connection.close()
        served_by = answer["redirect"]
    _runs_in(path, answer.get("pid", os.getpid()))
    if "pid" not in answer:
        connection.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)  # Start as usual.
        return
    try:
        _stand_in(answer["pid"], connection, replies, forwarded)
    except BaseException:
        import traceback

        traceback.print_exc()
    os._exit(1)  # Whatever went wrong: the command must not run here a second time.


def _stand_in(child, connection, replies, forwarded):
    """Until the child ends: its signals passed on, then its end made this process's."""
    import json
    import signal
    import socket
    import struct
    import threading

    zygote = struct.unpack("3i", connection.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]

    def forward():
        while True:
            got = signal.sigwaitinfo(forwarded)
            if got.si_signo == signal.SIGCONT and got.si_pid == zygote:
                continue  # The zygote's mirror of the child's own continuing.
            try:
                os.kill(child, got.si_signo)
            except ProcessLookupError:
                pass

    threading.Thread(target=forward, daemon=True).start()
    line = replies.readline()
    ended = json.loads(line) if line else {"exit": 1}
    if "signal" in ended:
        signum = ended["signal"]
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        # To this thread: sent to the process, the forwarding thread might wait it away.
        signal.pthread_kill(threading.main_thread().ident, signum)
        os._exit(128 + signum)  # A signal whose default is not to end a process.
    if not line:
        os.write(2, b"tests/zygote.py: the zygote ended before the command\n")
    os._exit(ended["exit"])


def _runs_in(path: str, pid: int) -> None:
    """Say which process runs this one's command (tests/zygote.py's ``running_pid`` reads it)."""
    name = f"{path}.pids/{os.getpid()}"
    try:
        with open(name + ".new", "w") as f:
            f.write(str(pid))
        os.replace(name + ".new", name)
    except OSError:
        pass


def _ignored(signal, signum) -> bool:
    try:
        return signal.getsignal(signum) == signal.SIG_IGN
    except (OSError, ValueError):
        return False


def _tfdp_origin() -> str:
    """The folder ``import tfdp`` would find, ``python -m`` putting the working folder first."""
    here = os.path.join(os.getcwd(), "tfdp")
    if os.path.exists(os.path.join(here, "__init__.py")):
        return here
    import importlib.util

    spec = importlib.util.find_spec("tfdp")
    return os.path.dirname(spec.origin) if spec and spec.origin else ""


def _shadowed() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec and spec.loader:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_hand_over()
_shadowed()
