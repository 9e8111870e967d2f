"""The allreduce across emulated hosts: section 12.7's arithmetic, measured.

  python -m tfdp.bench --hosts --allreduce --workers=2,3,4 --sizes=0.5MB,4MB --links=100mbit,1gbit

For each link rate and each k, k + 1 emulated hosts (``tfdp.launcher.emulated_hosts``: network namespaces on a
switch, every link shaped with ``tc tbf`` in both directions): k ``tfdp.server`` workers and, on
the last host, a client timing tfdp's ``add_n``, ``sharded`` and ``ring`` on the workers' devices
(``tfdp.bench.remote_allreduce``); then, on the same k hosts, k MultiWorkerMirroredStrategy
workers timing TensorFlow's own collective ring (``tfdp.bench.collective``).

Each row is set against what the textbook's arithmetic predicts for it
(``tfdp.paths.manual.algorithms``: the busiest host's time and bytes sent).
"""

import functools
import json
import os
import subprocess
import sys
import threading

from tfdp.bench.timing_process import MARK
from tfdp.launcher import emulated_hosts
from tfdp.launcher.children import prepare_child
from tfdp.paths.manual import algorithms
from tfdp.util import charts
from tfdp.util.errors import UserError

TF_ALGORITHM = "tf_collective_ring"
SERVER_PORT, COLLECTIVE_PORT = 2222, 2223
_SIZE_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9}
# tfdp's gradient is this many equal parameters unless --pieces says otherwise (divisible by 2, 3
# and 4: sharded gives each of k workers the same share), so sizes are rounded to multiples of
# 4 x PIECES bytes.
PIECES = 12
def parse_size(text: str) -> int:
    """``0.43MB``, ``4MB``, ``64KB``, ``1000000`` -> bytes (decimal units, as link rates)."""
    value = text.strip().lower()
    number = value.rstrip("kmgb")
    unit = value[len(number):]
    try:
        size = int(float(number) * _SIZE_UNITS[unit])
    except (ValueError, KeyError):
        size = 0
    if size < 4 * PIECES:
        raise UserError(f"--sizes entry {text!r} is not a size like 0.43MB, 4MB or 64KB (at "
                        f"least {4 * PIECES} bytes)")
    return size // (4 * PIECES) * (4 * PIECES)


def parse_dtype(text: str) -> str:
    """``float32``/``fp32`` or ``bfloat16``/``bf16`` -> the dtype's name."""
    from tfdp.config.settings import PRECISION_ALIASES

    name = PRECISION_ALIASES.get(text.strip(), text.strip())
    if name not in ("float32", "bfloat16"):
        raise UserError(f"--dtypes entry {text!r}: give float32 or bfloat16 (fp32, bf16)")
    return name


def measure(workers: list, sizes: list, links: list, repeats: int, say=print,
            dtypes=("float32",), pieces: int = PIECES) -> list:
    """Every row: tfdp's three algorithms (on a gradient of ``pieces`` equal parameters) and
    TensorFlow's ring (one tensor), each k, size (float32 bytes), dtype and link."""
    rates = [(link, emulated_hosts.parse_rate(link, "--links")) for link in links]
    emulated_hosts.check_available()
    stale = emulated_hosts.remove_stale()
    if stale:
        say(f"removed what a killed run left: {', '.join(stale)}")
    rows = []
    for link, rate in rates:
        for k in workers:
            say(f"{k} workers at {link}: tfdp's {', '.join(algorithms.NAMES)}, then TensorFlow's "
                f"ring; {len(sizes)} size(s) x {repeats} repeats ...")
            hosts = emulated_hosts.Hosts(k + 1, link)
            hosts.create()
            try:
                timeout = 120 + 4 * (repeats + 2) * len(dtypes) * sum(
                    algorithms.seconds("add_n", k, s, rate) for s in sizes)
                found = (_tfdp_rows(hosts, k, sizes, dtypes, repeats, timeout, pieces)
                         + _collective_rows(hosts, k, sizes, dtypes, repeats, timeout))
            finally:
                hosts.remove()
            for row in found:
                like = "ring" if row["algorithm"] == TF_ALGORITHM else row["algorithm"]
                row["link"], row["link_bits_per_s"] = link, rate
                share = row.get("pieces", 0)
                row["predicted_seconds"] = algorithms.seconds(like, k, row["bytes"], rate, share)
                row["ratio"] = row["seconds"] / row["predicted_seconds"]
                row["predicted_sent_bytes"] = algorithms.sent_bytes(like, k, row["bytes"], share)
            rows += found
    return rows


def _tfdp_rows(hosts, k, sizes, dtypes, repeats, timeout, pieces) -> list:
    """k servers on hosts 0..k-1, the client on host k."""
    workers = [f"{hosts.address(i)}:{SERVER_PORT}" for i in range(k)]
    cluster = {"chief": [f"{hosts.address(k)}:{SERVER_PORT}"], "worker": workers}
    servers = [_start(hosts, i, [sys.executable, "-m", "tfdp.server", "--nodata"],
                      _tf_config(cluster, "worker", i), read=False) for i in range(k)]
    try:
        client = _start(hosts, k, [sys.executable, "-m", "tfdp.bench.remote_allreduce",
                                   f"--sizes={','.join(map(str, sizes))}",
                                   f"--dtypes={','.join(dtypes)}", f"--repeats={repeats}",
                                   f"--pieces={pieces}"],
                        _tf_config(cluster, "chief", 0))
        return _rows_of(client, hosts, "the client of tfdp's algorithms", timeout)
    finally:
        _stop(servers)


def _collective_rows(hosts, k, sizes, dtypes, repeats, timeout) -> list:
    cluster = {"worker": [f"{hosts.address(i)}:{COLLECTIVE_PORT}" for i in range(k)]}
    procs = [_start(hosts, i, [sys.executable, "-m", "tfdp.bench.collective",
                               f"--sizes={','.join(map(str, sizes))}",
                               f"--dtypes={','.join(dtypes)}", f"--repeats={repeats}"],
                    _tf_config(cluster, "worker", i), read=i == 0) for i in range(k)]
    try:
        return _rows_of(procs[0], hosts, "TensorFlow's collective (worker 0)", timeout)
    finally:
        _stop(procs)


def _tf_config(cluster: dict, kind: str, index: int) -> dict:
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind,
                                                                 "index": index}})}


def _start(hosts, index: int, argv: list, env: dict, read: bool = True) -> subprocess.Popen:
    """``argv`` on host ``index``; its output piped to us if we ``read`` it (``_rows_of``), else
    dropped (a pipe nobody reads would block it once full)."""
    out = subprocess.PIPE if read else subprocess.DEVNULL
    return subprocess.Popen(
        argv, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env), stdin=subprocess.PIPE,
        stdout=out, stderr=out, text=True, start_new_session=True,
        preexec_fn=functools.partial(prepare_child, None, os.getpid(), hosts, index))


def _rows_of(proc, hosts, what: str, timeout: float) -> list:
    """The rows ``proc`` prints, each with the bytes the busiest host sent per call during its
    phase (the counters are read at every MARK)."""
    expired = []
    timer = threading.Timer(timeout, lambda: (expired.append(True), proc.kill()))
    timer.start()
    errors = []
    drain = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    drain.start()
    readings, last = [], ""
    try:
        for line in proc.stdout:
            if line.startswith(MARK):
                readings.append(hosts.counters())
                proc.stdin.write("\n")
                proc.stdin.flush()
            elif line.strip():
                last = line
        proc.wait()
    finally:
        timer.cancel()
    drain.join(timeout=10)
    if proc.returncode != 0:
        if expired:
            raise UserError(f"{what} did not finish within {timeout:.0f} s")
        tail = ("".join(errors).strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"{what} failed ({proc.returncode}): {tail}")
    rows = json.loads(last)
    for row, before, after in zip(rows, readings[0::2], readings[1::2]):
        row["sent_bytes_per_call"] = max(
            (a[0] - b[0]) for a, b in zip(after, before) if a and b) / row["calls"]
    return rows


def _stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def format_rows(rows: list) -> str:
    pieces = sorted({r["pieces"] for r in rows if "pieces" in r})
    cut = ("" if not pieces else "; tfdp's gradient in one tensor" if pieces == [1] else
           f"; tfdp's gradient in {' or '.join(map(str, pieces))} equal parameters")
    lines = ["allreduce across emulated hosts: median of the timed calls after one warm-up; "
             f"predicted: the textbook's arithmetic (tfdp/bench/hosts.py){cut}",
             "| link | workers | size | dtype | algorithm | measured | predicted | "
             "measured / predicted | busiest host sent | predicted |",
             "|" + " --- |" * 10]
    def amount(n):
        return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} KB"

    for r in rows:
        dtype = {"float32": "fp32", "bfloat16": "bf16"}.get(r["dtype"], r["dtype"])
        lines.append(f"| {r['link']} | {r['workers']} | {amount(r['bytes'])} | {dtype} | "
                     f"{r['algorithm']} | {r['seconds'] * 1e3:.1f} ms | "
                     f"{r['predicted_seconds'] * 1e3:.1f} ms | {r['ratio']:.2f} | "
                     f"{amount(r['sent_bytes_per_call'])} | {amount(r['predicted_sent_bytes'])} |")
    return "\n".join(lines)


def plot(rows: list, path: str) -> None:
    """Time against k per algorithm, at the largest size on the slowest link: Fig. 12.7.3's
    question, measured (solid) against predicted (dashed)."""
    size = max(r["bytes"] for r in rows)
    rate = min(r["link_bits_per_s"] for r in rows)
    chosen = [r for r in rows if r["bytes"] == size and r["link_bits_per_s"] == rate]
    fig = charts.figure(7, 4.5)
    ax = fig.subplots()
    for i, algorithm in enumerate(dict.fromkeys(r["algorithm"] for r in chosen)):
        mine = sorted((r for r in chosen if r["algorithm"] == algorithm),
                      key=lambda r: r["workers"])
        ks = [r["workers"] for r in mine]
        color = f"C{i}"
        ax.plot(ks, [r["seconds"] * 1e3 for r in mine], "o-", color=color,
                label=f"{algorithm} measured")
        ax.plot(ks, [r["predicted_seconds"] * 1e3 for r in mine], "--", color=color, alpha=0.6,
                label=f"{algorithm} predicted")
    ax.set_xlabel("workers (k)")
    ax.set_ylabel("one allreduce (ms)")
    ax.set_xticks(sorted({r["workers"] for r in chosen}))
    ax.set_ylim(bottom=0)
    ax.set_title(f"{size / 1e6:.2f} MB over {chosen[0]['link']} links")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
