"""The hosts of a Slurm step's nodes, found without Slurm's controller: every task expands
``SLURM_STEP_NODELIST`` itself (as TensorFlow's ``SlurmClusterResolver`` and Lightning do), so
N tasks make no N requests to ``slurmctld`` and a container without Slurm's commands (Apptainer,
pyxis) works. A node is reached by its name, resolved where the job runs, or, where the user
says so:

* ``TFDP_NODE_HOST``: the host a node is reached at, a pattern of ``{node}`` (``{node}-ib``,
  ``{node}.fast.cluster``): the name of its address on another network;
* ``TFDP_NETWORK``: a network (``10.1.0.0/16``, or IPv6): of the addresses a node's host
  resolves to, the one in it (a node with several networks, named once).
"""

import ipaddress
import itertools
import os
import re
import socket

from tfdp.util.errors import UserError

HOST_PATTERN = "TFDP_NODE_HOST"
NETWORK = "TFDP_NETWORK"


def expand(nodelist: str) -> list:
    """Slurm's compressed node list, as ``scontrol show hostnames`` writes it out:
    ``"node[1-3,07],rack[1-2]-n[1-2]"`` -> ``node1 node2 node3 node07 rack1-n1 rack1-n2
    rack2-n1 rack2-n2`` (a range's numbers as wide as its first's)."""
    names = []
    for item in _top_level_items(nodelist):
        parts = re.split(r"\[([^\]]*)\]", item)  # Text, bracket, text, bracket, ..., text.
        if any("[" in text or "]" in text for text in parts[::2]):
            raise UserError(f"SLURM_STEP_NODELIST={nodelist!r}: unbalanced brackets in {item!r}")
        choices = [[text] if i % 2 == 0 else _numbers(text, nodelist)
                   for i, text in enumerate(parts)]
        names += ["".join(chosen) for chosen in itertools.product(*choices)]
    return names


def _top_level_items(nodelist: str) -> list:
    """``nodelist`` split at its commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    items.append(nodelist[start:])
    if not nodelist.strip() or any(not item.strip() for item in items):
        raise UserError(f"SLURM_STEP_NODELIST={nodelist!r} is not Slurm's form (node[1-2],gpu7)")
    return [item.strip() for item in items]


def _numbers(ranges: str, nodelist: str) -> list:
    """A bracket's ``"1-3,07"`` -> ``["1", "2", "3", "07"]``."""
    numbers = []
    for part in ranges.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not match or int(match[2] or match[1]) < int(match[1]):
            raise UserError(f"SLURM_STEP_NODELIST={nodelist!r}: [{ranges}] is not Slurm's form "
                            "of a range (1-3,07)")
        width = len(match[1])
        numbers += [str(n).zfill(width) for n in range(int(match[1]), int(match[2] or match[1])
                                                         + 1)]
    return numbers


def hosts(nodes: list, environ=None) -> list:
    """The host each of ``nodes`` is reached at from this task (see the module's docstring)."""
    env = os.environ if environ is None else environ
    pattern = env.get(HOST_PATTERN) or "{node}"
    if "{node}" not in pattern or re.search(r"\{(?!node\})", pattern):
        raise UserError(f"{HOST_PATTERN}={pattern!r} must name each node as {{node}} "
                        "(e.g. {node}-ib), and nothing else in braces")
    named = [pattern.replace("{node}", node) for node in nodes]
    if not env.get(NETWORK):
        return named
    try:
        network = ipaddress.ip_network(env[NETWORK], strict=False)
    except ValueError:
        raise UserError(f"{NETWORK}={env[NETWORK]!r} is not a network (10.1.0.0/16, "
                        "fd00::/64)") from None
    return [_address_in(host, network) for host in named]


def _address_in(host: str, network) -> str:
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"node host {host!r} does not resolve here ({e}): give "
                        f"{HOST_PATTERN} a name that does") from None
    inside = sorted(a for a in found if ipaddress.ip_address(a.split("%")[0]) in network)
    if not inside:
        raise UserError(f"node host {host!r} resolves to {', '.join(sorted(found))}, none in "
                        f"{NETWORK}={network}: name the network its fast address is on")
    return inside[0]
