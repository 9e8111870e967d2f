"""Emulated hosts: every process the launcher starts on a machine of its own, joined by a switch
through links of a finite rate, all on this one Linux machine.

Each host is a network namespace with one interface, ``eth0``, at its own address in a private
/24. Its other end is a port of a bridge (the switch) in a namespace of its own. Every link is
shaped in both directions with ``tc tbf`` at ``--link`` (a full-duplex network card of that
rate): on ``eth0`` for what the host sends, on the switch's port for what it receives. The
veth pairs are created inside the switch's namespace with their peer in the host's, so the
machine's own (root) namespace gets no address, route or interface, and the cluster has no
way out of its switch.

Everything is named ``tfdp-<launcher pid>-...``: on exit the launcher removes its namespaces
(which removes their links, and ends what still runs in them), and a launcher killed with
SIGKILL, which cannot clean up, leaves names the next ``--hosts`` launch recognises by the dead
pid and removes.
"""

import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys

from tfdp.util.errors import UserError
from tfdp.util.files import process_alive

PREFIX = "tfdp-"
_NAME = re.compile(r"^tfdp-(?P<pid>\d+)-(?P<role>sw|h\d+)$")
_CLONE_NEWNET = 0x40000000
_RATE = re.compile(r"^(?P<number>\d+(?:\.\d+)?)(?P<unit>|k|m|g)bit$")
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_rate(text: str, flag: str = "--link") -> int:
    """``tc`` rate syntax (``10mbit``, ``1gbit``, ``500kbit``) -> bits per second."""
    match = _RATE.match(text.strip().lower())
    if not match or float(match["number"]) <= 0:
        raise UserError(f"{flag}={text} is not a rate like 10mbit, 100mbit or 1gbit")
    return int(float(match["number"]) * _UNITS[match["unit"]])


def check_available() -> None:
    """Refuse in one line, saying what is missing, where hosts cannot be emulated."""
    if not sys.platform.startswith("linux"):
        raise UserError("--hosts needs Linux network namespaces; this is " + sys.platform)
    if os.geteuid() != 0:
        raise UserError("--hosts needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network "
                        "namespaces, links and a switch: run the launcher as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise UserError(f"--hosts needs the {tool} command (Debian: apt install iproute2)")


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list:
    """Names of the network namespaces ``ip netns`` knows."""
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def stale() -> list:
    """The namespaces of emulated hosts whose maker has gone (killed with SIGKILL)."""
    return [n for n in namespaces() if (m := _NAME.match(n)) and not process_alive(int(m["pid"]))]


def remove_stale() -> list:
    """Remove what launchers that are gone left behind; return the names."""
    left = stale()
    for name in sorted(left, key=lambda n: n.endswith("-sw")):  # Hosts first, then switches.
        _remove(name)
    return left


def _remove(name: str) -> None:
    for pid in _run("ip", "netns", "pids", name).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that overlaps no address or route this machine has."""
    used = []
    for line in _run("ip", "-4", "-o", "addr").splitlines():
        used.append(ipaddress.ip_network(line.split()[3], strict=False))
    for line in _run("ip", "-4", "route").splitlines():
        word = line.split()[0]
        if word != "default":
            used.append(ipaddress.ip_network(word if "/" in word else f"{word}/32",
                                             strict=False))
    for second in range(200, 256):
        for third in range(0, 256):
            candidate = ipaddress.ip_network(f"10.{second}.{third}.0/24")
            if not any(candidate.overlaps(net) for net in used):
                return candidate
    raise UserError("--hosts found no free /24 in 10.200.0.0-10.255.255.0 for its switch")


class Hosts:
    """``count`` emulated hosts on one switch, links shaped to ``link`` (None: unshaped)."""

    def __init__(self, count: int, link: str = None):
        self.count = count
        self.link = link
        self.rate = parse_rate(link) if link else None
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.names = [f"{self.tag}-h{i}" for i in range(count)]
        self.subnet = None
        self._made = []

    def address(self, index: int) -> str:
        return str(self.subnet.network_address + index + 1)

    def create(self) -> None:
        self.subnet = free_subnet()
        try:
            for name in [self.switch, *self.names]:
                _run("ip", "netns", "add", name)
                self._made.append(name)
                _run("ip", "-n", name, "link", "set", "lo", "up")
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                port = f"port{i}"
                # Made inside the switch's namespace, its peer inside the host's: the root
                # namespace never holds either end.
                _run("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name",
                     "eth0", "netns", name)
                _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
                _run("ip", "-n", self.switch, "link", "set", port, "up")
                _run("ip", "-n", name, "addr", "add",
                     f"{self.address(i)}/{self.subnet.prefixlen}", "dev", "eth0")
                _run("ip", "-n", name, "link", "set", "eth0", "up")
                if self.rate:
                    _shape(name, "eth0", self.rate)          # what the host sends
                    _shape(self.switch, port, self.rate)     # what it receives
        except BaseException:
            self.remove()
            raise

    def enter(self, index: int) -> None:
        """Move the calling process (a child before ``exec``) onto host ``index``."""
        fd = os.open(f"/run/netns/{self.names[index]}", os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)

    def up(self, index: int) -> bool:
        """Whether host ``index``'s link is up (an operator, or a test, may set it down)."""
        try:
            flags = json.loads(_run("ip", "-n", self.names[index], "-j", "link", "show",
                                    "eth0"))[0]["flags"]
        except (RuntimeError, ValueError, LookupError):
            return False  # Not made, or gone.
        return "UP" in flags

    def reachable(self, first: list) -> list:
        """The hosts ``first`` (kept in front: a client's), then every other whose link is up."""
        return [*first, *(i for i in range(self.count) if i not in first and self.up(i))]

    def describe(self, roles: list) -> list:
        """One line per host: its namespace, address, what runs there (``roles[i]``), link."""
        rate = f"{self.link} each way" if self.link else "unshaped"
        return [f"host {i} ({name}) at {self.address(i)} runs {roles[i]}, link {rate}"
                for i, name in enumerate(self.names)]

    def counters(self) -> list:
        """``(sent, received)`` bytes of every host's link so far, as its network card counts
        them (headers included); None for a host that is gone."""
        found = []
        for name in self.names:
            try:
                stats = json.loads(_run("ip", "-n", name, "-j", "-s", "link", "show", "eth0")
                                   )[0]["stats64"]
                found.append((stats["tx"]["bytes"], stats["rx"]["bytes"]))
            except (RuntimeError, ValueError, LookupError):
                found.append(None)  # Not made, or already gone: nothing to count.
        return found

    def traffic(self, roles: dict) -> list:
        """One line per host: the bytes its link carried each way so far (``roles[i]`` runs
        there last, if anything does)."""
        return [f"host {i} ({roles.get(i, 'no process now')}) sent {c[0] / 1e6:.2f} MB, "
                f"received {c[1] / 1e6:.2f} MB" for i, c in enumerate(self.counters()) if c]

    def remove(self) -> None:
        """Remove every namespace made (their links go with them, and what runs in them)."""
        for name in reversed(self._made):
            _remove(name)
        self._made = []


def _shape(namespace: str, device: str, rate: int) -> None:
    # A bucket of at least one timer tick's worth of bytes (HZ is 100 to 1000), never under
    # 64 KiB: smaller buckets throttle below the rate.
    burst = max(64 * 1024, rate // 8 // 100)
    _run("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate",
         f"{rate}bit", "burst", str(burst), "latency", "100ms")
