"""The from-scratch path's allreduce algorithms, declared once and read without TensorFlow: the
name ``--allreduce`` takes, its line in ``--help``, and what the textbook's arithmetic (section
12.7) says its busiest host sends and how long it takes. ``tfdp.paths.manual.allreduce``
implements each (``<name>_allreduce``); the flag's check and help, the bench's configurations
and the bench's predictions across hosts read this table.

The arithmetic, with S bytes of gradient, k workers and links of B bytes/s each way (full
duplex; only each host's own link limits):

* ``add_n``: every worker sends its S to worker 0, whose incoming link carries (k-1)S; then
  worker 0 sends the sum to the k-1 others, its outgoing link carrying (k-1)S. One phase after
  the other: 2(k-1)S/B, growing with k.
* ``sharded``: worker i sums parameter i mod k. Each worker sends the (k-1)/k of its gradient
  that others own while it receives the (k-1) copies of its own 1/k: (k-1)S/(kB) each way at
  once, then the same again for the broadcast: 2(k-1)S/(kB). With P equal parameters that k
  does not divide, the busiest worker owns f = ceil(P/k)/P of them, receives (k-1)fS while
  sending (1-f)S, then the reverse: 2 max((k-1)f, 1-f) S/B (P = 1: add_n's time).
* ``ring`` (and TensorFlow's collective ring): 2(k-1) steps, in each of which every link carries
  S/k each way at once: 2(k-1)S/(kB), "which does not grow as we increase the size of the ring".

The figures count payload only: no headers, no framing, no latency, no computation (the sums).
"""

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    # (k, f) -> the busiest host's time on one link, in units of S/B; f is the share of the
    # gradient the busiest worker sums under ``sharded`` (1/k when k divides the parameters).
    time: Callable[[int, float], float]
    # (k, f) -> the bytes the busiest host sends, in units of S.
    sent: Callable[[int, float], float]


ALGORITHMS = {a.name: a for a in (
    Algorithm("add_n", "the textbook's: every gradient summed on the first device and sent back",
              time=lambda k, f: 2 * (k - 1), sent=lambda k, f: k - 1),
    Algorithm("sharded", "parameter-server style: each device sums its share of the parameters",
              time=lambda k, f: 2 * max((k - 1) * f, 1 - f),
              sent=lambda k, f: 1 - f + (k - 1) * f),
    Algorithm("ring", "each device sends and receives 1/k of the gradient 2(k-1) times",
              time=lambda k, f: 2 * (k - 1) / k, sent=lambda k, f: 2 * (k - 1) / k),
)}
NAMES = tuple(ALGORITHMS)
DEFAULT = "add_n"


def busiest_share(workers: int, pieces: int = 0) -> float:
    """The share of the gradient the worker summing most sums under ``sharded``: of ``pieces``
    equal parameters (0: evenly, whatever k)."""
    return 1 / workers if not pieces else -(-pieces // workers) / pieces


def seconds(name: str, workers: int, size: int, link_bits_per_s: float, pieces: int = 0) -> float:
    """Seconds the arithmetic gives one allreduce of ``size`` bytes over links of this rate."""
    return ALGORITHMS[name].time(workers, busiest_share(workers, pieces)) * size / (
        link_bits_per_s / 8)


def sent_bytes(name: str, workers: int, size: int, pieces: int = 0) -> float:
    """Bytes the busiest host sends in one allreduce of ``size`` bytes."""
    return ALGORITHMS[name].sent(workers, busiest_share(workers, pieces)) * size


def help_text() -> str:
    """``--allreduce``'s help."""
    named = [f"{a.name} ({a.summary})" for a in ALGORITHMS.values()]
    return f"{', '.join(named[:-1])} or {named[-1]}."
