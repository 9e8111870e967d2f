"""A private network for the local workers: a new network namespace with loopback only.

TensorFlow's gRPC servers bind ``0.0.0.0:<port>`` whatever address ``TF_CONFIG`` names
(``grpc_server_lib.cc``), have no authentication, and run whatever graph a client sends. Workers
started for a local run must not be reachable from other machines, containers or namespaces.
``private_loopback()`` moves the calling process (the launcher, before it starts its workers,
which inherit it) into a new network namespace whose only interface is its own loopback: the
workers reach each other on 127.0.0.1, and nothing outside reaches them. The namespace goes
away with the last process in it.

As root this is ``unshare(CLONE_NEWNET)``. Otherwise, where the kernel allows unprivileged user
namespaces, it creates one first (mapping the user to itself), which grants the capability to
make the network namespace and bring its loopback up, and nothing outside it.
"""

import ctypes
import errno
import fcntl
import os
import socket
import struct

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def private_loopback():
    """Enter a new network namespace with loopback up. Returns ``(True, how)`` or
    ``(False, why not)``. Call it while the process has a single thread."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) == 0:
        _loopback_up()
        return True, "a private network namespace"
    first = ctypes.get_errno()
    if first not in (errno.EPERM, errno.EACCES):
        return False, f"unshare: {os.strerror(first)}"
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return False, (f"unshare: {os.strerror(first)} (no CAP_SYS_ADMIN), and no unprivileged user "
                       f"namespace ({os.strerror(ctypes.get_errno())})")
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _loopback_up()
    except OSError as e:
        return False, f"user namespace set-up failed ({e.strerror or e})"
    return True, "a private network namespace (in a user namespace)"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | _IFF_UP))
