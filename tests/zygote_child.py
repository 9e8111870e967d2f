"""What a child the zygote (tests/zygote_server.py) forks does to become the command handed to
it, as that command would have started: the stand-in's namespaces entered, its groups, open
files, working folder, umask, CPU affinity, priority, limits, environment, signal dispositions
and mask, standard streams and arguments taken, then the module left for ``runpy`` to run."""

import ctypes
import io
import os
import resource
import signal
import sys

from zygote import die_with_parent

# setns's flag for each namespace a child may enter (tests/zygote_server.py's ENTERED).
NAMESPACE_FLAGS = {"net": 0x40000000, "mnt": 0x00020000}
_PR_SET_NAME = 15
_HIGH_FD = 1000  # Received files wait here while the command's own numbers are freed.
_libc = ctypes.CDLL(None, use_errno=True)


def become(request: dict, fds: list, entered: dict, groups: list, imported: dict) -> None:
    """In the forked child: the command's process, as it would have started."""
    die_with_parent()
    os.setsid()
    for kind, fd in entered.items():  # Single-threaded, as a fork's child is: mnt allows it.
        if _libc.setns(fd, NAMESPACE_FLAGS[kind]) != 0:
            raise OSError(ctypes.get_errno(), f"setns to the stand-in's {kind} namespace")
        os.close(fd)
    if groups != os.getgroups():
        os.setgroups(groups)
    high = [_dup_high(fd) for fd in fds]
    for fd in fds:
        os.close(fd)
    for target, fd in zip(request["fds"], high):
        os.dup2(fd, target, inheritable=True)
    for fd in high:
        os.close(fd)
    for target in (0, 1, 2):
        if target not in request["fds"]:
            try:
                os.close(target)
            except OSError:
                pass
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.sched_setaffinity(0, request["affinity"])
    os.setpriority(os.PRIO_PROCESS, 0, request["priority"])
    for name, (soft, hard) in request["rlimits"].items():
        limit = getattr(resource, name)
        if resource.getrlimit(limit) != (soft, hard):
            resource.setrlimit(limit, (soft, hard))
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(imported)
    import tempfile

    tempfile.tempdir = None  # Found again from the command's environment.
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(signum, signal.SIG_IGN if signum in request["ignored"]
                          else signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # Those Python may not set (32, 33: the C library's own).
    if signal.SIGINT not in request["ignored"]:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # What Python does at start.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
    _stdio(request["fds"], request["env"])
    sys.argv = ["-m", *request["argv"][3:]]
    sys.path[0] = request["cwd"]
    _libc.prctl(_PR_SET_NAME, request["module"].rsplit(".", 1)[-1][:15].encode(), 0, 0, 0)
    parent, _, name = request["module"].rpartition(".")
    sys.modules.pop(request["module"], None)
    if parent in sys.modules and hasattr(sys.modules[parent], name):
        delattr(sys.modules[parent], name)


def _stdio(fds: list, env: dict) -> None:
    """sys.stdin, sys.stdout and sys.stderr as Python makes them at start for these files."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding = sys.stdout.encoding if sys.stdout else "utf-8"

    def stream(fd, mode, errors):
        if fd not in fds:
            return None
        interactive = os.isatty(fd)
        if mode == "r":
            return io.open(fd, "r", encoding=encoding, errors=errors, newline="\n",
                           closefd=False)
        text = io.open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
        return io.TextIOWrapper(text, encoding=encoding, errors=errors, newline="\n",
                                line_buffering=not unbuffered and (interactive or fd == 2),
                                write_through=unbuffered)

    sys.stdin = sys.__stdin__ = stream(0, "r", "strict")
    sys.stdout = sys.__stdout__ = stream(1, "w", "strict")
    sys.stderr = sys.__stderr__ = stream(2, "w", "backslashreplace")


def _dup_high(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, _HIGH_FD)
