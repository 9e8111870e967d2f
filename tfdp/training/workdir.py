"""A run folder belongs to one run at a time, and files in it are replaced, never half-written.

``claim`` takes an exclusive lock per worker (``.lock-worker-<i>``, a ``flock`` the kernel drops
when the process dies, however it dies), so a second run given the same ``--workdir`` is refused
in one line instead of colliding with the first or silently resuming from its backups.
``write_atomic`` writes through a temporary file created exclusively (``mkstemp``: a name nobody
else can have planted, so a symlink in a shared folder is never followed) and renames it over
the target.
"""

import contextlib
import dataclasses
import fcntl
import os
import tempfile
import time

from tfdp.cluster import tf_config
from tfdp.config import RUN_STAMP_ENV, Config
from tfdp.errors import UserError

_HELD = {}  # path -> fd, for the claims of this process


@contextlib.contextmanager
def claim(run_dir: str, worker_index: int = 0):
    """Hold ``run_dir`` for this run (worker ``worker_index``) until the block ends."""
    path = os.path.join(run_dir, f".lock-worker-{worker_index}")
    try:
        os.makedirs(run_dir, exist_ok=True)
        fd = locked(path, wait=False)
    except BlockingIOError:
        holder = _read(path).strip() or "?"
        raise UserError(f"--workdir={run_dir} is in use by another run (pid {holder}): wait for "
                        "it to end, or give this run its own --workdir") from None
    except OSError as e:
        raise UserError(f"--workdir={run_dir} is not writable ({e.strerror or e}): give a "
                        "--workdir you can write to") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[path] = fd
    try:
        yield
    finally:
        _HELD.pop(path, None)
        os.close(fd)  # Releases the lock; the file stays (removing it would race a new claim).


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


def _read(path: str) -> str:
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


def with_run_dir(config: Config) -> Config:
    """``config`` with ``workdir`` set: a new folder per run by default,
    ``runs/<strategy>-<model>-<n>dev-<date>-<time>``, so runs never overwrite each other and
    ``tensorboard --logdir runs`` compares them. To resume a run, pass its folder as
    ``--workdir``."""
    if config.workdir is not None:
        return config
    stamp = os.environ.get(RUN_STAMP_ENV)
    if stamp is None and config.strategy == "multi_worker" and tf_config.num_workers() > 1:
        raise UserError("--strategy=multi_worker with several workers needs --workdir: every "
                        "worker must use the same run folder (tfdp.launch chooses one for you)")
    base = os.path.join("runs", f"{config.strategy}-{config.model}-{config.num_gpus}dev-"
                                f"{stamp or time.strftime('%Y%m%d-%H%M%S')}")
    path, n = base, 1
    while stamp is None and os.path.exists(path):  # Two runs started in the same second.
        n += 1
        path = f"{base}-{n}"
    return dataclasses.replace(config, workdir=path)
