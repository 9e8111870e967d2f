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
  of ``tfdp.bench.hosts.predict`` for the gradient's bytes (TensorFlow's ring for
  multi_worker), with no overlap of communication and computation.
* k real machines: each computes 1/k of the batch on cores of its own, so the step would take
  the one-host compute / k plus the communication measured here.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from tfdp import hosts as emulated_hosts
from tfdp.bench.hosts import predict
from tfdp.errors import UserError

PATHS = ("manual", "multi_worker")


def gradient_bytes() -> int:
    """LeNet's float32 parameters, the bytes every step's allreduce sums."""
    from tfdp import logs

    logs.import_tensorflow()  # Without TensorFlow's start-up banners.
    from tfdp.models import lenet

    return sum(v.size * 4 for v in lenet.init_params(0, init="glorot").values())


def parse(text: str) -> dict:
    parts = text.strip().split(":")
    if (len(parts) not in (2, 3) or parts[0] not in PATHS or not parts[1].isdigit()
            or int(parts[1]) < 1 or (len(parts) == 3 and (
                parts[0] != "manual" or parts[2] not in ("add_n", "sharded", "ring")))):
        raise UserError(f"--configs entry {text!r}: with --hosts, expected manual:k[:add_n|"
                        "sharded|ring] or multi_worker:k (k hosts)")
    allreduce = parts[2] if len(parts) == 3 else ("add_n" if parts[0] == "manual" else "-")
    return {"name": text.strip(), "path": parts[0], "workers": int(parts[1]),
            "allreduce": allreduce}


def measure(configs: list, links: list, batch_size: int, steps: int, epochs: int, rounds: int,
            data_dir=None, manual_dir=None, say=print) -> list:
    """One row per configuration and link (None: unshaped), with its step split."""
    rates = {link: emulated_hosts.parse_rate(link, "--links") for link in links}
    emulated_hosts.check_available()
    if epochs < 2:
        raise UserError("--epochs must be 2 or more with --hosts: the first epoch (tracing) is "
                        "not timed")
    size = gradient_bytes()
    samples = {}
    for round_ in range(rounds):
        for config in configs:
            for link in [None, *links]:
                say(f"round {round_ + 1}/{rounds}: {config['name']} on "
                    f"{link or 'unshaped'} links ...")
                samples.setdefault((config["name"], link), []).extend(
                    _run(config, link, batch_size, steps, epochs, data_dir, manual_dir))
    rows = []
    for config in configs:
        k = config["workers"]
        compute = batch_size / statistics.median(samples[(config["name"], None)])
        alone = next((c for c in configs if c["path"] == config["path"] and c["workers"] == 1),
                     None)
        compute_one = (batch_size / statistics.median(samples[(alone["name"], None)])
                       if alone else None)
        for link in [None, *links]:
            step = batch_size / statistics.median(samples[(config["name"], link)])
            like = "ring" if config["path"] == "multi_worker" else config["allreduce"]
            predicted = predict(like, k, size, rates[link]) if link and k > 1 else 0.0
            communication = step - compute
            rows.append({
                **config, "link": link or "unshaped",
                "link_bits_per_s": rates.get(link), "gradient_bytes": size,
                "batch_size": batch_size, "step_seconds": step, "compute_seconds": compute,
                "communication_seconds": communication,
                "predicted_communication_seconds": predicted,
                "predicted_step_seconds": compute + predicted,
                "ratio": step / (compute + predicted),
                "k_machines_step_seconds": (compute_one / k + communication
                                            if compute_one else None),
                "samples": samples[(config["name"], link)]})
    return rows


def _run(config, link, batch_size, steps, epochs, data_dir, manual_dir) -> list:
    """Examples/s of each timed epoch of one launch."""
    workdir = tempfile.mkdtemp(prefix="tfdp-bench-hosts-")
    train = [f"--strategy={config['path']}", f"--batch_size={batch_size}", f"--epochs={epochs}",
             f"--steps_per_epoch={steps}", "--eval_steps=1", "--init=glorot",
             f"--workdir={workdir}", f"--export_dir={workdir}/export"]
    if config["path"] == "manual":
        train.append(f"--allreduce={config['allreduce']}")
    train += [f"--data_dir={data_dir}"] * bool(data_dir)
    train += [f"--manual_dir={manual_dir}"] * bool(manual_dir)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tfdp.launch", f"--num_workers={config['workers']}",
             "--hosts", *([f"--link={link}"] if link else []), "--", *train],
            capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        if result.returncode != 0:
            tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise UserError(f"{config['name']} on {link or 'unshaped'} links failed: {tail}")
        with open(os.path.join(workdir, "metrics.json")) as f:
            return [e["examples_per_sec"] for e in json.load(f)["epochs"][1:]]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def format_rows(rows: list) -> str:
    def ms(value):
        return "-" if value is None else f"{value * 1e3:.1f} ms"

    size = rows[0]["gradient_bytes"] / 1e6 if rows else 0
    lines = [f"training LeNet across emulated hosts: batch {rows[0]['batch_size'] if rows else 0}"
             f", gradient {size:.2f} MB; compute = the step on unshaped links; predicted = compute"
             " + the allreduce arithmetic; k machines = one host's compute / k + the "
             "communication measured",
             "| config | link | step | compute | communication | predicted communication | "
             "predicted step | measured / predicted | k real machines |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['link']} | {ms(r['step_seconds'])} | "
                     f"{ms(r['compute_seconds'])} | {ms(r['communication_seconds'])} | "
                     f"{ms(r['predicted_communication_seconds'])} | "
                     f"{ms(r['predicted_step_seconds'])} | {r['ratio']:.2f} | "
                     f"{ms(r['k_machines_step_seconds'])} |")
    return "\n".join(lines)
