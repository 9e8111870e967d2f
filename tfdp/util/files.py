"""Files on the ground floor: replaced, never half-written; locked by whoever holds them.

``write_atomic`` writes through a temporary file created exclusively (``mkstemp``: a name nobody
else can have planted, so a symlink in a shared folder is never followed) and renames it over
the target. ``locked`` takes an exclusive ``flock`` the kernel drops when the process dies,
however it dies, and ``unlock`` removes the lock file as it lets go, so nothing is left behind.
``process_alive`` tells whether a leftover's writer still runs.
"""

import contextlib
import fcntl
import os
import stat
import tempfile


def locked(path: str, wait: bool = True) -> int:
    """An exclusive ``flock`` on ``path``, created if need be: waited for, or (``wait=False``)
    ``BlockingIOError`` while another process holds it. Closing the returned fd releases it,
    and so does the process's death, however it dies. ``O_NOFOLLOW`` and no truncation: a
    symlink planted in a shared folder is never followed.

    The holder removes the file when it lets go (``unlock``): a process that opened it just
    before then holds a lock on a file no longer there, so the lock counts only while ``path``
    is still the file locked; otherwise it is taken again on the file now at ``path``."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            held = os.fstat(fd)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # Removed by its holder meanwhile: lock the one at path now.


def unlock(path: str, fd: int) -> None:
    """Let go of ``locked(path)``'s ``fd`` and remove the lock file (while still holding it, so
    nobody else holds it: see ``locked``)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    os.close(fd)


def read_start(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read(32)
    except OSError:
        return ""


def write_atomic(path: str, write, mode: str = "w") -> None:
    """Call ``write(file)`` on a new temporary file beside ``path``, then rename it to ``path``."""
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a leftover's writer, known by its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # Alive, another user's.
        pass
    return True


def away_from_a_closed_terminal() -> None:
    """After SIGHUP (the terminal closed, the ssh session lost): standard output and error that
    went to that terminal go to /dev/null instead, since a write to a terminal that has hung up
    fails (EIO) and would end the saving that follows with a traceback. Under ``nohup`` or with
    the output in a file nothing changes."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            # A terminal that has hung up is no longer one to isatty (its ioctl fails): a
            # character device, as a terminal is (and /dev/null, which changes nothing).
            if stat.S_ISCHR(os.fstat(fd).st_mode):
                os.dup2(null, fd)
    finally:
        os.close(null)
