"""Training across emulated hosts: a step split into compute and communication, against the
allreduce arithmetic.

  python -m tfdp.bench --hosts --links=10mbit,100mbit,1gbit \
      --configs=manual:1,manual:2:add_n,manual:2:ring,manual:4:add_n,manual:4:ring,multi_worker:2

Every configuration ``path:k[:allreduce]`` is a real ``tfdp.launch --hosts`` run on k hosts
(``manual``: k ``tfdp.server`` workers and their client; ``multi_worker``: k Keras workers),
once with unshaped links and once per ``--links`` rate. The per-epoch timings come from the
run's own ``metrics.json`` (the first epoch, tracing and warm-up, dropped).

* compute: the step on unshaped links, where LeNet's 0.52 MB gradient costs well under a
  millisecond to move. All emulated hosts share this machine's cores, so this is what k hosts
  compute *here*, not what k machines would.
* communication: the step on a shaped link minus compute; predicted: the allreduce arithmetic
  of ``tfdp.paths.manual.algorithms.seconds`` for the gradient's bytes (TensorFlow's ring for
  multi_worker), with no overlap of communication and computation.
* k real machines: each computes 1/k of the batch on cores of its own, so the step would take
  the one-host compute / k plus the communication measured here.

``parameter_server:m[:ps=n]`` runs m workers and n parameter servers (``--ps_shards=n``, so
that LeNet's large parameters are spread over all n), each on a host of its own, and is set
against the chapter's O(m/n) arithmetic (``predict_parameter_server``): every step pulls the
S bytes of parameters to its worker and pushes S bytes of gradient back, so the busiest
server's link carries what it holds, s_max (about S/n), each way per step: with links of B
bytes/s, at most B / s_max steps a second in all, n times more with n servers. A worker pulls,
computes, then pushes, one step after the other, so its own link is busy one way at a time:
at most B / 2S steps a second each, m B / 2S together. The prediction is the smaller bound;
workers overlap one another's transfers and computation, so the predicted step is the larger
of compute and that communication, not their sum.
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import NamedTuple, Optional

from tfdp import paths
from tfdp.bench import entries
from tfdp.launcher import emulated_hosts
from tfdp.paths.manual import algorithms
from tfdp.util.errors import UserError

_SENT = re.compile(r"^tfdp\.launch: host \d+ \((?:worker|ps)[^)]*\) sent ([\d.]+) MB", re.M)


def gradient_bytes() -> int:
    """LeNet's float32 parameters, the bytes every step's allreduce sums."""
    from tfdp.util import logs

    logs.import_tensorflow()  # Without TensorFlow's start-up banners.
    from tfdp.models import lenet

    return sum(v.size * 4 for v in lenet.init_params(0, init="glorot").values())


HOSTS_FORM = ("manual:k[:add_n|sharded|ring][:acc=K][:bucket=KB][:overlap=none], "
              "multi_worker:k or parameter_server:k[:ps=n] (k hosts, and n more for the "
              "servers; K micro-batches per update; gradients in buckets of KB)")


def parse(text: str) -> dict:
    clustered = {p.name: p for p in paths.all_paths() if p.cluster != paths.NO_CLUSTER}
    entry = entries.parse(text, "--configs", tuple(clustered),
                          f"with --hosts, expected {HOSTS_FORM}")
    path, settings = clustered[entry.path], entry.settings
    own_allreduce = "allreduce" in path.own_flags
    allowed = ({"acc", "bucket", "overlap"} if own_allreduce else set()) | (
        {"ps"} if path.parameter_servers else set())
    allreduce = [w for w in entry.words if w in algorithms.NAMES and own_allreduce]
    if (len(allreduce) != len(entry.words) or len(allreduce) > 1 or set(settings) - allowed
            or settings.get("overlap", "none") != "none"
            or not all(settings[k].isdigit() and int(settings[k]) > 0
                       for k in ("acc", "bucket", "ps") if k in settings)):
        raise entry.refuse(f"with --hosts, expected {HOSTS_FORM}")
    return {"name": entry.text, "path": entry.path, "workers": entry.count,
            "allreduce": allreduce[0] if allreduce else (
                path.own_flags["allreduce"].off[0] if own_allreduce else "-"),
            "accumulate": int(settings.get("acc", 1)),
            "bucket_kb": int(settings["bucket"]) if "bucket" in settings else None,
            "overlap": settings.get("overlap", "auto"),
            "servers": int(settings.get("ps", 1)) if path.parameter_servers else 0}


def predict_parameter_server(workers: int, gradient: int, busiest_server: int,
                             link_bits_per_s: float) -> float:
    """Seconds per step of the workers together, bound by the links (module doc)."""
    per_second = link_bits_per_s / 8
    return max(busiest_server, 2 * gradient / workers) / per_second


class Launch(NamedTuple):
    """What each launch trains: its global batch, steps an epoch and epochs (the first, the
    tracing one, is not timed), on the data of these folders."""
    batch_size: int
    steps: int
    epochs: int
    data_dir: Optional[str] = None
    manual_dir: Optional[str] = None


def measure(configs: list, links: list, launch: Launch, rounds: int, say=print) -> list:
    """One row per configuration and link (None: unshaped), with its step split."""
    batch_size, epochs = launch.batch_size, launch.epochs
    rates = {link: emulated_hosts.parse_rate(link, "--links") for link in links}
    emulated_hosts.check_available()
    if epochs < 2:
        raise UserError("--epochs must be 2 or more with --hosts: the first epoch (tracing) is "
                        "not timed")
    size = gradient_bytes()
    samples, held, sent = {}, {}, {}
    for round_ in range(rounds):
        for config in configs:
            for link in [None, *links]:
                say(f"round {round_ + 1}/{rounds}: {config['name']} on "
                    f"{link or 'unshaped'} links ...")
                rates_, facts, sent_ = _run(config, link, launch)
                samples.setdefault((config["name"], link), []).extend(rates_)
                sent.setdefault((config["name"], link), []).append(sent_)
                held[config["name"]] = facts.get("parameter_server_bytes")
    rows = []
    for config in configs:
        k = config["workers"]
        # A step is an update: --accumulate_steps micro-batches of batch_size.
        update = batch_size * config.get("accumulate", 1)
        compute = update / statistics.median(samples[(config["name"], None)])
        alone = next((c for c in configs if c["path"] == config["path"] and c["workers"] == 1),
                     None)
        compute_one = (batch_size / statistics.median(samples[(alone["name"], None)])
                       if alone else None)
        for link in [None, *links]:
            step = update / statistics.median(samples[(config["name"], link)])
            sent_per_epoch = statistics.median(sent[(config["name"], link)])
            communication = step - compute
            path = paths.get(config["path"])
            if path.parameter_servers:
                busiest = max(held[config["name"]])
                predicted = (predict_parameter_server(k, size, busiest, rates[link])
                             if link else 0.0)
                rows.append({
                    **config, "link": link or "unshaped", "link_bits_per_s": rates.get(link),
                    "gradient_bytes": size, "busiest_server_bytes": busiest,
                    "batch_size": batch_size, "step_seconds": step, "compute_seconds": compute,
                    "communication_seconds": communication, "steps_per_second": 1 / step,
                    "predicted_communication_seconds": predicted,
                    "predicted_step_seconds": max(compute, predicted),
                    "ratio": step / max(compute, predicted),
                    "k_machines_step_seconds": None, "sent_bytes_per_epoch": sent_per_epoch,
                    "samples": samples[(config["name"], link)]})
                continue
            # TensorFlow's collectives (every task a worker) exchange as a ring does.
            like = "ring" if path.cluster == paths.WORKERS else config["allreduce"]
            predicted = algorithms.seconds(like, k, size, rates[link]) if link and k > 1 else 0.0
            rows.append({
                **config, "link": link or "unshaped",
                "link_bits_per_s": rates.get(link), "gradient_bytes": size,
                "batch_size": batch_size, "step_seconds": step, "compute_seconds": compute,
                "communication_seconds": communication,
                "predicted_communication_seconds": predicted,
                "predicted_step_seconds": compute + predicted,
                "ratio": step / (compute + predicted),
                # An update of K micro-batches is K of the one host's steps, shared by k.
                "k_machines_step_seconds": (compute_one * config.get("accumulate", 1) / k
                                            + communication if compute_one else None),
                "sent_bytes_per_epoch": sent_per_epoch,
                "samples": samples[(config["name"], link)]})
    return rows


def _run(config, link, launch: Launch) -> tuple:
    """(examples/s of each timed epoch, the run's metrics.json, the bytes the busiest worker
    host sent per epoch) of one launch. With --accumulate_steps=K an epoch has steps / K
    updates: the same examples as K=1's."""
    workdir = tempfile.mkdtemp(prefix="tfdp-bench-hosts-")
    accumulate = config.get("accumulate", 1)
    train = [f"--strategy={config['path']}", f"--batch_size={launch.batch_size}",
             f"--epochs={launch.epochs}",
             f"--steps_per_epoch={max(1, launch.steps // accumulate)}", "--eval_steps=1",
             "--init=glorot", f"--workdir={workdir}", f"--export_dir={workdir}/export"]
    if config["allreduce"] != "-":
        train += [f"--allreduce={config['allreduce']}", f"--accumulate_steps={accumulate}",
                  f"--overlap={config.get('overlap', 'auto')}"]
        train += [f"--bucket_kb={config['bucket_kb']}"] * bool(config.get("bucket_kb"))
    servers = []
    if config["servers"]:
        servers = [f"--num_ps={config['servers']}"]
        train.append(f"--ps_shards={config['servers']}")
    train += [f"--data_dir={launch.data_dir}"] * bool(launch.data_dir)
    train += [f"--manual_dir={launch.manual_dir}"] * bool(launch.manual_dir)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tfdp.launch", f"--num_workers={config['workers']}",
             *servers, "--hosts", *([f"--link={link}"] if link else []), "--", *train],
            capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        if result.returncode != 0:
            tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise UserError(f"{config['name']} on {link or 'unshaped'} links failed: {tail}")
        with open(os.path.join(workdir, "metrics.json")) as f:
            metrics = json.load(f)
        # The launcher's count of each host's link (tfdp.launcher.emulated_hosts.traffic).
        sent = [float(mb) * 1e6 for mb in _SENT.findall(result.stderr)]
        return ([e["examples_per_sec"] for e in metrics["epochs"][1:]], metrics,
                max(sent) / launch.epochs if sent else None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def format_rows(rows: list) -> str:
    def ms(value):
        return "-" if value is None else f"{value * 1e3:.1f} ms"

    def mb(value):
        return "-" if value is None else f"{value / 1e6:.2f} MB"

    size = rows[0]["gradient_bytes"] / 1e6 if rows else 0
    lines = [f"training LeNet across emulated hosts: batch {rows[0]['batch_size'] if rows else 0}"
             f", gradient {size:.2f} MB; a step is an update (acc=K: K micro-batches of the batch, "
             "one allreduce); compute = the step on unshaped links; predicted = compute"
             " + the allreduce arithmetic; k machines = one host's compute / k + the "
             "communication measured; sent per epoch = the bytes the busiest worker host's link "
             "sent in all / epochs (headers and start-up included)",
             "| config | link | step | compute | communication | predicted communication | "
             "predicted step | measured / predicted | k real machines | sent per epoch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["servers"]:
            continue
        lines.append(f"| {r['name']} | {r['link']} | {ms(r['step_seconds'])} | "
                     f"{ms(r['compute_seconds'])} | {ms(r['communication_seconds'])} | "
                     f"{ms(r['predicted_communication_seconds'])} | "
                     f"{ms(r['predicted_step_seconds'])} | {r['ratio']:.2f} | "
                     f"{ms(r['k_machines_step_seconds'])} | {mb(r['sent_bytes_per_epoch'])} |")
    servers = [r for r in rows if r["servers"]]
    if servers:
        lines += ["", "parameter servers: steps a second of all workers together; predicted: "
                  "the links' bound min(B / s_max, m B / 2S), or compute where it binds "
                  "(tfdp/bench/host_training.py)",
                  "| config | link | workers m | servers n | busiest server holds (s_max) | "
                  "steps/s | compute-bound steps/s | predicted steps/s | measured / predicted |",
                  "|" + " --- |" * 9]
        for r in servers:
            lines.append(f"| {r['name']} | {r['link']} | {r['workers']} | {r['servers']} | "
                         f"{r['busiest_server_bytes'] / 1e3:.1f} KB | "
                         f"{r['steps_per_second']:.2f} | {1 / r['compute_seconds']:.2f} | "
                         f"{1 / r['predicted_step_seconds']:.2f} | "
                         f"{r['predicted_step_seconds'] / r['step_seconds']:.2f} |")
    return "\n".join(lines)


def format_overlap(rows: list) -> str:
    """12.3.2's table: for each manual row on a shaped link that has a twin with
    ``overlap=none`` (the same hosts and allreduce, no buckets), the step against compute and
    communication alone. Compute alone: the row's step on unshaped links; communication alone:
    the barrier twin's step on that link minus its unshaped step (with the barrier nothing
    overlaps); overlap fraction: (compute + communication - step) / min(compute,
    communication)."""
    lines = ["overlap of communication with the backward pass: compute = the step on unshaped "
             "links; communication = the overlap=none twin's step on the link minus its own "
             "compute; fraction = (sum - step) / min(compute, communication)",
             "| config | link | compute | communication | sum (no overlap) | max (perfect "
             "overlap) | step | step / max | overlap fraction |",
             "|" + " --- |" * 9]
    by_name = {(r["name"], r["link"]): r for r in rows}
    for r in rows:
        if r["allreduce"] == "-" or r["link"] == "unshaped" or r["workers"] < 2:
            continue
        twin = f"{r['path']}:{r['workers']}:{r['allreduce']}:overlap=none"
        if (twin, r["link"]) not in by_name:
            continue
        barrier = by_name[(twin, r["link"])]
        communication = barrier["step_seconds"] - barrier["compute_seconds"]
        compute, step = r["compute_seconds"], r["step_seconds"]
        total, most = compute + communication, max(compute, communication)
        fraction = (total - step) / min(compute, communication)
        lines.append(f"| {r['name']} | {r['link']} | {compute * 1e3:.1f} ms | "
                     f"{communication * 1e3:.1f} ms | {total * 1e3:.1f} ms | {most * 1e3:.1f} ms"
                     f" | {step * 1e3:.1f} ms | {step / most:.2f} | {fraction:.2f} |")
    return "\n".join(lines)
