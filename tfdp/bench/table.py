"""``python -m tfdp.bench``: throughput and scaling of every path, side by side, and allreduce.

Every configuration is a real ``tfdp.train`` run in a process of its own (devices and thread
pools are fixed per process), started in interleaved rounds, so the machine's noise spreads
over all of them alike. Throughput comes from the per-epoch timings the run itself writes in
``metrics.json``; the first epoch (tracing, warm-up) is dropped, the rest pooled over rounds.

  python -m tfdp.bench                                   # the default table, real data
  python -m tfdp.bench --data=synthetic --configs=manual:1,manual:2,manual:2:ring
  python -m tfdp.bench --configs= --allreduce            # the allreduce table only
  python -m tfdp.bench --hosts --allreduce --workers=2,3,4 --sizes=4MB --links=100mbit
                                                         # across emulated hosts (root)

A configuration is ``path:devices[:option...]``; path is manual, mirrored, multi_worker,
plain (Keras fit, no strategy, tfdp's input pipeline) or stock (Keras fit on numpy arrays,
default threads: ``tfdp.bench.stock``); options are an allreduce (add_n, sharded, ring),
``eager``, ``spe=N`` (steps per execution, Keras paths), ``bf16`` (``--precision=bfloat16``)
and ``intra=N`` / ``inter=N`` (TensorFlow's thread pools, through ``TF_NUM_INTRAOP_THREADS`` and
``TF_NUM_INTEROP_THREADS``; default: tfdp's share of the cores per device). The tuned Keras
``fit`` of LeNet on one device, to hold tfdp's paths against (measured in docs/benchmarks.md)::

  python -m tfdp.bench --configs=manual:2,manual:2:bf16,plain:1:spe=16,plain:1:bf16:spe=16,...

Every row says what fraction of the machine's fp32 and bf16 matmul ceilings (a 2048x2048
matmul on all cores, measured in the same run) its training FLOPs reach.
"""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from tfdp.bench.host_allreduce import PIECES

# With --hosts, unless given: shorter runs than on one machine (a 10 Mbit/s link makes a step
# of add_n on 4 hosts last seconds).
HOSTS_CONFIGS = ("manual:1,manual:2:add_n,manual:2:ring,manual:4:add_n,manual:4:ring,"
                 "multi_worker:2,multi_worker:4")
HOSTS_DEFAULTS = {"configs": HOSTS_CONFIGS.split(","), "steps": 20, "epochs": 2, "rounds": 1}
flags.DEFINE_list("configs",
                  "stock:1,plain:1,manual:1,manual:2,mirrored:1,mirrored:2,multi_worker:2",
                  "Configurations to run (see the module doc).")
flags.DEFINE_enum("data", "real", ["real", "synthetic"],
                  "real: the Fashion-MNIST pipeline; synthetic: same shapes, made in memory.")
flags.DEFINE_enum("model", "lenet", ["lenet", "resnet18"], "Model to train.")
flags.DEFINE_integer("batch_size", 256, "Global batch.")
flags.DEFINE_integer("steps", 60, "Timed steps per epoch (an epoch window).")
flags.DEFINE_integer("epochs", 3, "Epochs per run; the first is warm-up and not counted.")
flags.DEFINE_integer("rounds", 2, "Interleaved rounds over all configurations.")
flags.DEFINE_boolean("allreduce", False, "Also run the allreduce micro-benchmark.")
flags.DEFINE_list("allreduce_sizes", None, "Allreduce sizes in bytes (default 4K..64M).")
flags.DEFINE_boolean("hosts", False, "Across emulated hosts (Linux, root) instead of one "
                     "machine: the training table (configs manual:k[:allreduce], multi_worker:k, "
                     "parameter_server:k[:ps=n]; "
                     f"default {HOSTS_CONFIGS} with --steps=20 --epochs=2 --rounds=1) and, with "
                     "--allreduce, the allreduce table.")
flags.DEFINE_list("workers", ["2", "3", "4"], "--hosts: worker counts k to try.")
flags.DEFINE_list("sizes", ["0.5MB", "4MB"], "--hosts: gradient sizes (0.43MB, 4MB, 45MB ...).")
flags.DEFINE_list("dtypes", ["float32"], "--hosts --allreduce: what the gradients travel in "
                  "(float32, bfloat16: tfdp.train's --allreduce_dtype); --sizes are float32 bytes.")
flags.DEFINE_list("links", ["10mbit", "100mbit", "1gbit"],
                  "--hosts: link rates, each way (tc syntax).")
flags.DEFINE_integer("repeats", 5, "--hosts: timed allreduce calls per row, after a warm-up.")
flags.DEFINE_integer("pieces", PIECES, "--hosts --allreduce: equal parameters tfdp's gradient "
                     f"is cut into ({PIECES}: sharded is balanced on 2, 3 and 4 workers; 1: one "
                     "tensor, so add_n's gather and broadcast cannot overlap).")
flags.DEFINE_string("workdir", os.path.join("runs", "bench"), "Where the table, JSON and chart go.")
flags.DEFINE_string("data_dir", None, "TFDS data dir (as for tfdp.train).")
flags.DEFINE_string("manual_dir", None, "Fashion-MNIST .gz folder (as for tfdp.train).")
FLAGS = flags.FLAGS

EPOCH_EXAMPLES = 60000
PATHS = ("manual", "mirrored", "multi_worker", "plain", "stock")


def parse_config(text: str) -> dict:
    parts = text.strip().split(":")
    if len(parts) < 2 or parts[0] not in PATHS or not parts[1].isdigit() or int(parts[1]) < 1:
        raise ValueError(f"--configs entry {text!r}: expected path:devices[:option...] with "
                         f"path in {', '.join(PATHS)}")
    config = {"name": text.strip(), "path": parts[0], "devices": int(parts[1]),
              "allreduce": "add_n" if parts[0] == "manual" else "-", "eager": False, "spe": 1,
              "precision": "float32", "intra": None, "inter": None}
    for option in parts[2:]:
        name, _, value = option.partition("=")
        if option in ("add_n", "sharded", "ring"):
            config["allreduce"] = option
        elif option == "eager":
            config["eager"] = True
        elif option in ("bf16", "bfloat16"):
            config["precision"] = "bfloat16"
        elif name in ("spe", "intra", "inter") and value.isdigit() and int(value) > 0:
            config[name] = int(value)
        else:
            raise ValueError(f"--configs entry {text!r}: unknown option {option!r}")
    if config["path"] == "stock" and (config["precision"] != "float32" or config["spe"] > 1):
        raise ValueError(f"--configs entry {text!r}: stock is Keras' defaults (float32, one "
                         "step per execution); tune plain:1 instead")
    return config


def train_command(config: dict, workdir: str) -> list:
    if config["path"] == "stock":
        return [sys.executable, "-m", "tfdp.bench.stock", f"--workdir={workdir}",
                f"--batch_size={FLAGS.batch_size}", f"--epochs={FLAGS.epochs}",
                f"--steps={FLAGS.steps}", *(["--synthetic"] if FLAGS.data == "synthetic" else []),
                *([f"--data_dir={FLAGS.data_dir}"] if FLAGS.data_dir else [])]
    args = [f"--model={FLAGS.model}", f"--batch_size={FLAGS.batch_size}",
            f"--epochs={FLAGS.epochs}", f"--steps_per_epoch={FLAGS.steps}", "--eval_steps=1",
            "--init=glorot", f"--workdir={workdir}", f"--export_dir={workdir}/export"]
    args += [f"--data_dir={FLAGS.data_dir}"] * bool(FLAGS.data_dir)
    args += [f"--manual_dir={FLAGS.manual_dir}"] * bool(FLAGS.manual_dir)
    args += ["--synthetic_data"] * (FLAGS.data == "synthetic")
    args += ["--eager"] * config["eager"]
    args += [f"--precision={config['precision']}"]
    if config["path"] == "manual":
        args.append(f"--allreduce={config['allreduce']}")
    else:
        args.append(f"--steps_per_execution={config['spe']}")
    if config["path"] == "multi_worker":
        return [sys.executable, "-m", "tfdp.launch", f"--num_workers={config['devices']}", "--",
                "--strategy=multi_worker", "--num_gpus=1", *args]
    return [sys.executable, "-m", "tfdp.train", f"--strategy={config['path']}",
            f"--num_gpus={config['devices']}", *args]


def run_once(config: dict) -> list:
    """Examples/s of each timed (non-first) epoch of one run."""
    workdir = tempfile.mkdtemp(prefix="tfdp-bench-")
    try:
        threads = {name: str(config[key]) for key, name in (
            ("intra", "TF_NUM_INTRAOP_THREADS"), ("inter", "TF_NUM_INTEROP_THREADS"))
            if config[key]}
        result = subprocess.run(train_command(config, workdir), capture_output=True, text=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **threads))
        if result.returncode != 0:
            tail = result.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise RuntimeError(f"{config['name']} failed: {tail[0]}")
        with open(os.path.join(workdir, "metrics.json")) as f:
            epochs = json.load(f)["epochs"]
        return [e["examples_per_sec"] for e in epochs[1:]]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def matmul_gflops(dtype="float32", n=2048, repeats=10) -> float:
    """The machine's practical ceiling in ``dtype``: a large matmul on all cores."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal([n, n]), dtype)
    tf.linalg.matmul(a, a).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        tf.linalg.matmul(a, a).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def training_flops_per_example(model_name: str) -> float:
    """Forward multiply-adds of conv and dense layers x 2 FLOPs, x 3 for forward + backward."""
    import keras

    from tfdp.models import lenet, resnet

    model = lenet.keras_model() if model_name == "lenet" else resnet.resnet()
    forward = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw, cin, cout = layer.kernel.shape
            _, h, w, _ = layer.output.shape
            forward += 2 * h * w * cout * kh * kw * cin
        elif isinstance(layer, keras.layers.Dense):
            forward += 2 * layer.kernel.shape[0] * layer.kernel.shape[1]
    return 3.0 * forward


def summarise(configs, samples, ceilings, flops_per_example) -> list:
    """One row per configuration. ``ceilings``: matmul GFLOP/s by dtype name. ``vs_plain``
    compares with the fastest plain fit of the row's precision; ``vs_fp32``, with the same
    configuration in float32."""
    rows = []
    for config in configs:
        rates = samples[config["name"]]
        median = statistics.median(rates)
        row = {**config, "examples_per_sec": median, "min": min(rates), "max": max(rates),
               "runs": len(rates), "sec_per_epoch": EPOCH_EXAMPLES / median}
        for dtype, gflops in ceilings.items():
            row[f"of_{dtype}_ceiling"] = flops_per_example * median / (gflops * 1e9)
        row["flops_fraction"] = row[f"of_{config['precision']}_ceiling"]
        rows.append(row)

    def alike(r, row, *keys):
        return all(r[key] == row[key] for key in keys)

    for row in rows:
        one = next((r for r in rows if r["path"] == row["path"] and r["devices"] == 1
                    and r["allreduce"] in (row["allreduce"], "add_n", "-")
                    and alike(r, row, "eager", "spe", "precision", "intra", "inter")), None)
        row["speedup"] = row["examples_per_sec"] / one["examples_per_sec"] if one else None
        row["efficiency"] = row["speedup"] / row["devices"] if one else None
        plain = [r for r in rows if r["path"] == "plain" and r["precision"] == row["precision"]]
        best = max(plain, key=lambda r: r["examples_per_sec"], default=None)
        row["vs_plain"] = row["examples_per_sec"] / best["examples_per_sec"] if best else None
        stock = next((r for r in rows if r["path"] == "stock"), None)
        row["vs_stock"] = row["examples_per_sec"] / stock["examples_per_sec"] if stock else None
        fp32 = next((r for r in rows if r["precision"] == "float32" and alike(
            r, row, "path", "devices", "allreduce", "eager", "spe", "intra", "inter")), None)
        row["vs_fp32"] = (row["examples_per_sec"] / fp32["examples_per_sec"]
                          if fp32 and row["precision"] != "float32" else None)
    return rows


def format_table(rows, ceilings, flops_per_example) -> str:
    def opt(value, fmt):
        return format(value, fmt) if value is not None else "-"

    lines = [f"{FLAGS.model}, global batch {FLAGS.batch_size}, {FLAGS.data} data, "
             f"{FLAGS.steps} steps x {FLAGS.epochs - 1} timed epochs x {FLAGS.rounds} rounds; "
             f"matmul ceilings {ceilings['float32']:.0f} GFLOP/s fp32, "
             f"{ceilings['bfloat16']:.0f} bf16; {flops_per_example / 1e6:.1f} MFLOP per "
             "training example; vs plain fit: the fastest plain row of the same precision",
             "| config | path | devices | allreduce | precision | step | threads | "
             "examples/s (min-max) | sec/epoch | speedup vs 1 | efficiency | vs fp32 | "
             "vs plain fit | vs stock fit | of fp32 ceiling | of bf16 ceiling |",
             "|" + " --- |" * 16]
    for r in rows:
        step = "eager" if r["eager"] else ("compiled" if r["spe"] == 1 else
                                           f"compiled, {r['spe']} steps/call")
        threads = (f"{r['intra'] or 'tfdp'} intra, {r['inter'] or 'tfdp'} inter"
                   if r["intra"] or r["inter"] else "tfdp's")
        precision = "bf16" if r["precision"] == "bfloat16" else "fp32"
        lines.append(
            f"| {r['name']} | {r['path']} | {r['devices']} | {r['allreduce']} | {precision} | "
            f"{step} | {threads} | "
            f"{r['examples_per_sec']:.0f} ({r['min']:.0f}-{r['max']:.0f}) | "
            f"{r['sec_per_epoch']:.1f} | {opt(r['speedup'], '.2f')} | "
            f"{opt(r['efficiency'], '.0%')} | {opt(r['vs_fp32'], '.2f')} | "
            f"{opt(r['vs_plain'], '.2f')} | {opt(r['vs_stock'], '.2f')} | "
            f"{r['of_float32_ceiling']:.1%} | {r['of_bfloat16_ceiling']:.1%} |")
    return "\n".join(lines)


def format_allreduce(result) -> str:
    lines = [f"allreduce, best of 5; memcpy {result['memcpy_gbps']:.1f} GB/s",
             "| algorithm | k | size | time | bus bandwidth |", "| --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        size = (f"{r['bytes'] >> 20} MB" if r["bytes"] >= 1 << 20 else f"{r['bytes'] >> 10} KB")
        if "error" in r:
            lines.append(f"| {r['algorithm']} | {r['k']} | {size} | n/a: {r['error']} | |")
        else:
            lines.append(f"| {r['algorithm']} | {r['k']} | {size} | "
                         f"{r['seconds'] * 1e3:.2f} ms | {r['bus_gbps']:.2f} GB/s |")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
    names = [r["name"] for r in rows]
    ax.barh(names, [r["examples_per_sec"] for r in rows],
            xerr=[[r["examples_per_sec"] - r["min"] for r in rows],
                  [r["max"] - r["examples_per_sec"] for r in rows]], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("training examples / s (median, min-max)")
    ax.set_title(f"{FLAGS.model}, batch {FLAGS.batch_size}, {FLAGS.data} data")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv):
    del argv
    if FLAGS.hosts:
        return main_hosts()
    try:
        configs = [parse_config(c) for c in FLAGS.configs if c.strip()]
    except ValueError as e:
        sys.exit(f"tfdp.bench: error: {e}")
    os.makedirs(FLAGS.workdir, exist_ok=True)
    report = {"flags": {k: getattr(FLAGS, k) for k in ("configs", "data", "model", "batch_size",
                                                       "steps", "epochs", "rounds")}}
    text = []
    if configs:
        samples = {c["name"]: [] for c in configs}
        for round_ in range(FLAGS.rounds):
            for config in configs:
                print(f"round {round_ + 1}/{FLAGS.rounds}: {config['name']} ...", flush=True)
                try:
                    samples[config["name"]] += run_once(config)
                except RuntimeError as e:
                    sys.exit(f"tfdp.bench: error: {e}")
        ceilings = {dtype: matmul_gflops(dtype) for dtype in ("float32", "bfloat16")}
        flops = training_flops_per_example(FLAGS.model)
        rows = summarise(configs, samples, ceilings, flops)
        report.update(matmul_gflops=ceilings["float32"], matmul_gflops_by_dtype=ceilings,
                      training_flops_per_example=flops, rows=rows, samples=samples)
        text.append(format_table(rows, ceilings, flops))
        plot(rows, os.path.join(FLAGS.workdir, "bench.png"))
    if FLAGS.allreduce:
        sizes = [f"--sizes={','.join(FLAGS.allreduce_sizes)}"] if FLAGS.allreduce_sizes else []
        out = subprocess.run([sys.executable, "-m", "tfdp.bench.allreduce", *sizes],
                             capture_output=True, text=True,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        if out.returncode != 0:
            sys.exit(f"tfdp.bench: error: allreduce benchmark failed: {out.stderr[-500:]}")
        report["allreduce"] = json.loads(out.stdout.strip().splitlines()[-1])
        text.append(format_allreduce(report["allreduce"]))
    with open(os.path.join(FLAGS.workdir, "bench.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(FLAGS.workdir, "bench.md"), "w") as f:
        f.write("\n\n".join(text) + "\n")
    print("\n\n".join(text))
    print(f"\nwritten: {FLAGS.workdir}/bench.json, bench.md" + (", bench.png" if configs else ""))


def main_hosts():
    """``--hosts``: training across emulated hosts (``tfdp.bench.host_training``, written as
    training_hosts.md and .json) and, with ``--allreduce``, the allreduce across them
    (``tfdp.bench.host_allreduce``: allreduce_hosts.md, .json and .png), in --workdir."""
    from tfdp.bench import host_allreduce, host_training
    from tfdp.errors import UserError

    def setting(name):
        return getattr(FLAGS, name) if FLAGS[name].present else HOSTS_DEFAULTS[name]

    def say(line):
        print(f"tfdp.bench: {line}", flush=True)

    # SIGTERM as Ctrl-C: the emulated hosts of the moment are removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    text = []
    try:
        configs = [host_training.parse(c) for c in setting("configs") if c.strip()]
        workers = [int(k) for k in FLAGS.workers if k.strip()]
        if FLAGS.allreduce and (not workers or min(workers) < 2):
            raise UserError(f"--workers={','.join(FLAGS.workers)}: give worker counts of 2 or "
                            "more, e.g. 2,3,4")
        sizes = [host_allreduce.parse_size(s) for s in FLAGS.sizes] if FLAGS.allreduce else []
        dtypes = [host_allreduce.parse_dtype(d) for d in FLAGS.dtypes if d.strip()]
        if FLAGS.repeats < 1:
            raise UserError(f"--repeats must be a positive integer, got {FLAGS.repeats}")
        if FLAGS.pieces < 1:
            raise UserError(f"--pieces must be a positive integer, got {FLAGS.pieces}")
        os.makedirs(FLAGS.workdir, exist_ok=True)
        if configs:
            rows = host_training.measure(configs, FLAGS.links, FLAGS.batch_size,
                                         setting("steps"), setting("epochs"), setting("rounds"),
                                         FLAGS.data_dir, FLAGS.manual_dir, say=say)
            _write(os.path.join(FLAGS.workdir, "training_hosts"), rows,
                   host_training.format_rows(rows))
            text.append(host_training.format_rows(rows))
        if FLAGS.allreduce:
            rows = host_allreduce.measure(workers, sizes, FLAGS.links, FLAGS.repeats, say=say,
                                          dtypes=dtypes, pieces=FLAGS.pieces)
            base = os.path.join(FLAGS.workdir, "allreduce_hosts")
            _write(base, rows, host_allreduce.format_rows(rows))
            host_allreduce.plot(rows, base + ".png")
            text.append(host_allreduce.format_rows(rows))
    except (UserError, ValueError) as e:
        sys.exit(f"tfdp.bench: error: {e}")
    print("\n\n".join(text))
    print(f"\nwritten in {FLAGS.workdir}: "
          + ", ".join(["training_hosts.md, .json"] * bool(configs)
                      + ["allreduce_hosts.md, .json, .png"] * FLAGS.allreduce))


def _write(base: str, rows: list, table: str) -> None:
    with open(base + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(table + "\n")


def run():
    app.run(main)


if __name__ == "__main__":
    run()
