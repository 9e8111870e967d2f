"""A run folder: named once per run, and held by one run at a time.

``new_folder`` chooses the default folder, ``runs/<strategy>-<model>-<n>dev-<date>-<time>``.
``claim`` takes an exclusive lock per worker (``.lock-worker-<i>``, a ``tfdp.util.files.locked``
``flock`` the kernel drops when the process dies, however it dies; the file is removed when the
run ends, and a killed run's is taken over), so a second run given the same ``--workdir`` is
refused in one line instead of colliding with the first or silently resuming from its backups;
a folder whose run finished and exported is refused too (``Finished``: nothing is left to do).
"""

import contextlib
import errno
import os
import time

from tfdp.cluster import tf_config
from tfdp.config.settings import RUN_STAMP_ENV, Config
from tfdp.training import report
from tfdp.util.errors import Finished, UserError
from tfdp.util.files import locked, read_start, unlock
from tfdp.util.logs import logger

_HELD = {}  # path -> fd, for the claims of this process
# What flock raises on a file system that keeps no locks.
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


@contextlib.contextmanager
def claim(run_dir: str, worker_index: int = 0):
    """Hold ``run_dir`` for this run (worker ``worker_index``) until the block ends; a folder
    made here and left empty (a run refused before it wrote anything) is removed then.
    ``Finished`` where the run in it has finished and exported."""
    path = os.path.join(run_dir, f".lock-worker-{worker_index}")
    made = not os.path.exists(run_dir)
    try:
        os.makedirs(run_dir, exist_ok=True)
        fd = locked(path, wait=False)
    except BlockingIOError:
        holder = read_start(path).strip() or "?"
        raise UserError(f"--workdir={run_dir} is in use by another run (pid {holder}): wait for "
                        "it to end, or give this run its own --workdir") from None
    except OSError as e:
        if e.errno not in NO_LOCKS:
            raise UserError(f"--workdir={run_dir} is not writable ({e.strerror or e}): give a "
                            "--workdir you can write to") from None
        # A shared volume without file locks (NFS mounted nolock, some CSI drivers): the run
        # trains as well; only a second run given this folder would not be refused.
        logger.warning("--workdir=%s is on a file system without locks (%s): nothing refuses "
                       "a second run given the same --workdir while this one runs", run_dir,
                       e.strerror or e)
        fd = None
    if fd is not None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD[path] = fd
    try:
        done = report.exported(run_dir)
        if done:
            raise Finished(run_dir, done)
        yield
    finally:
        _HELD.pop(path, None)
        if fd is not None:
            unlock(path, fd)
        if made:
            with contextlib.suppress(OSError):  # Not empty: the run wrote to it.
                os.rmdir(run_dir)


def new_folder(config: Config, every_task_trains: bool) -> str:
    """A new run folder for ``config``, which names none: ``runs/<strategy>-<model>-<n>dev-
    <date>-<time>``, so runs never overwrite each other and ``tensorboard --logdir runs``
    compares them (to resume a run, pass its folder as ``--workdir``). Where every task of a
    cluster trains, its workers share the stamp their launcher or manager chose."""
    stamp = os.environ.get(RUN_STAMP_ENV)
    if stamp is None and every_task_trains and tf_config.num_workers() > 1:
        raise UserError(f"--strategy={config.strategy} with several workers needs --workdir: "
                        "every worker must use the same run folder (tfdp.launch chooses one for "
                        "you)")
    base = config.default_run_dir(stamp or time.strftime("%Y%m%d-%H%M%S"))
    path, n = base, 1
    while stamp is None and os.path.exists(path):  # Two runs started in the same second.
        n += 1
        path = f"{base}-{n}"
    return path
