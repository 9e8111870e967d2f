"""``python -m zygote_probe WHAT``: what a process sees of itself, as one JSON line on stdout,
then, as ``WHAT`` says: ``exit`` (with code 7), ``wait`` (until SIGTERM, which it answers by
exiting 3), ``die`` (by SIGUSR2), ``read`` (its stdin, before the line) or ``hold FILE MB``
(first a line saying whether a lock on FILE was free, then MB mebibytes of memory touched, for
a slow end, as a training process's, then ``wait``). tests/test_zygote.py runs it forked by
the zygote and started as usual, and compares."""

import json
import os
import resource
import signal
import sys
import time


def seen(stdin=None) -> dict:
    return {
        "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
        "env": {k: os.environ.get(k) for k in ("PROBE", "TPU_ML_PLATFORM", "HOME")},
        "tty": [os.isatty(fd) for fd in (0, 1, 2)],
        "buffering": [sys.stdout.line_buffering, sys.stderr.line_buffering,
                      sys.stdout.encoding, sys.stderr.errors],
        "signals": {name: str(signal.getsignal(getattr(signal, name)))
                    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE", "SIGUSR1", "SIGCHLD")},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "umask": os.umask(0o22),
        "affinity": sorted(os.sched_getaffinity(0)),
        "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd") if _open(int(fd))),
        "stdin": stdin,
        "groups": sorted(os.getgroups()),
        "looked": sorted(os.listdir(os.environ["PROBE_LOOK"])) if "PROBE_LOOK" in os.environ
        else None,
    }


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "hold":
        import fcntl

        held = open(sys.argv[2], "w")
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            print(json.dumps({"locked": True}), flush=True)
        except BlockingIOError:
            print(json.dumps({"locked": False}), flush=True)
            sys.exit(9)
        memory = bytearray(b"x") * (int(sys.argv[3]) << 20)
        print(json.dumps({"touched": len(memory)}), flush=True)
        what = "wait"
    if what == "wait":
        # Not print: a SIGTERM sent as soon as the line is read can come while print still
        # holds stdout's lock, and a second print inside it raises (a reentrant call).
        signal.signal(signal.SIGTERM, lambda *_: (os.write(1, b"terminated\n"), os._exit(3)))
    print(json.dumps(seen(sys.stdin.read() if what == "read" else None)), flush=True)
    if what == "exit":
        sys.exit(7)
    if what == "die":
        os.kill(os.getpid(), signal.SIGUSR2)
    while what == "wait":
        time.sleep(1)
