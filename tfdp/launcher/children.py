"""What a launcher's child does between ``fork`` and ``exec`` (``preexec_fn``): the launcher's
workers (``tfdp.launch``) and the host benchmark's processes (``tfdp.bench.host_allreduce``)."""

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def prepare_child(cores, launcher_pid, emulated, index):
    """Onto emulated host ``index`` (if ``emulated``), pinned to ``cores`` (if given), and
    dying with the launcher however the launcher dies (SIGKILL included: the kernel sends
    SIGKILL to the orphan)."""
    if emulated:
        emulated.enter(index)
    if cores:
        os.sched_setaffinity(0, cores)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher_pid:  # The launcher died before prctl took effect.
        os._exit(1)
