"""CPU-seconds per test, for finding where the suite's time goes (docs/design.md#tests):

  PYTHONPATH=tests python -m pytest -p cpu_per_test   # then: sort -t$'\\t' -k3 -rn cpu.tsv

Appends a line per test to ``$TFDP_CPU_TSV`` (default ``cpu.tsv``): its id, wall seconds, then
CPU-seconds of the test's own process and of the child processes it waited for (each xdist
worker counts its own, so the figures hold with tests running side by side; the commands its
zygote forked, ``tests/zygote.py``, count with the children), then when it started (Unix
time: what ran beside what, and which tests end a whole run alone)."""

import os
import resource
import time

import pytest

import zygote


def _cpu() -> tuple:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime,
            children.ru_utime + children.ru_stime + zygote.children_cpu())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    began, start, (own, children) = time.time(), time.monotonic(), _cpu()
    yield
    own_after, children_after = _cpu()
    with open(os.environ.get("TFDP_CPU_TSV", "cpu.tsv"), "a") as f:
        f.write(f"{item.nodeid}\t{time.monotonic() - start:.2f}\t{own_after - own:.2f}\t"
                f"{children_after - children:.2f}\t{began:.1f}\n")
