"""Files on the ground floor: replaced, never half-written; locked by whoever holds them.

``write_atomic`` writes through a temporary file created exclusively (``mkstemp``: a name nobody
else can have planted, so a symlink in a shared folder is never followed) and renames it over
the target. ``locked`` takes an exclusive ``flock`` the kernel drops when the process dies,
however it dies. ``process_alive`` tells whether a leftover's writer still runs.
"""

import contextlib
import fcntl
import os
import tempfile


def locked(path: str, wait: bool = True) -> int:
    """An exclusive ``flock`` on ``path``, created if need be: waited for, or (``wait=False``)
    ``BlockingIOError`` while another process holds it. Closing the returned fd releases it,
    and so does the process's death, however it dies. ``O_NOFOLLOW`` and no truncation: a
    symlink planted in a shared folder is never followed."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BaseException:
        os.close(fd)
        raise
    return fd


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
