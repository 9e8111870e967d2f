"""``python -m tfdp.bench``: throughput and scaling of every path, side by side, and allreduce.

Every configuration is a real ``tfdp.train`` run in a process of its own (devices and thread
pools are fixed per process), started in interleaved rounds, so the machine's noise spreads
over all of them alike. Throughput comes from the per-epoch timings the run itself writes in
``metrics.json``; the first epoch (tracing, warm-up) is dropped, the rest pooled over rounds.

  python -m tfdp.bench                                   # the default table, real data
  python -m tfdp.bench --data=synthetic --configs=manual:1,manual:2,manual:2:ring
  python -m tfdp.bench --configs= --allreduce            # the allreduce table only
  python -m tfdp.bench --configs= --cadence              # section 12.2: tfdp.bench.cadence
  python -m tfdp.bench --hosts --allreduce --workers=2,3,4 --sizes=4MB --links=100mbit
                                                         # across emulated hosts (root)
  python -m tfdp.bench --time_to_accuracy=0.9            # seconds to 0.90, MLPerf's way
                                                         # (tfdp.bench.time_to_accuracy)
  python -m tfdp.bench --elastic --workers=2,3            # what --num_workers=1:k costs

A configuration is ``path:devices[:option...]``; path is manual, mirrored, multi_worker,
plain (Keras fit, no strategy, tfdp's input pipeline) or stock (Keras fit on numpy arrays,
default threads: ``tfdp.bench.stock``); options are an allreduce (add_n, sharded, ring),
``eager``, ``jit`` (``--jit_compile``: XLA; manual and plain), ``spe=N`` (steps per execution,
Keras paths), ``bf16`` (``--precision=bfloat16``) and ``intra=N`` / ``inter=N`` (TensorFlow's
thread pools, through ``TF_NUM_INTRAOP_THREADS`` and ``TF_NUM_INTEROP_THREADS``; default:
tfdp's share of the cores per device), and ``backup=N`` (``--backup_every=N``: steps, or a time
like ``30s``; a row without it backs up at the default interval, which the bench's epochs never
reach). The tuned Keras ``fit`` of LeNet on one device, to hold
tfdp's paths against (measured in docs/benchmarks.md)::

  python -m tfdp.bench --configs=manual:2,manual:2:bf16,plain:1:spe=16,plain:1:bf16:spe=16,...

Every row says what fraction of the machine's fp32 and bf16 matmul ceilings (a 2048x2048
matmul on all cores, measured in the same run) its training FLOPs reach.
"""

import json
import os
import signal
import subprocess
import sys

from absl import app, flags

from tfdp.config import model_spec
from tfdp.bench.configs import (check_command, parse_config, run_once, train_command,
                                training_flops_per_example)
from tfdp.bench.host_allreduce import PIECES
from tfdp.bench.results import format_allreduce, format_table, plot, summarise, write_table
from tfdp.bench.time_to_accuracy import DEFAULT_CONFIGS as TTA_CONFIGS
from tfdp.config.flags import help_parser
from tfdp.util.errors import UserError

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
flags.DEFINE_string("model", "lenet", "Model to train on every configuration, Keras' stock fit "
                    "included: lenet, lenet_bn, resnet18, or yours (as tfdp.train's --model: "
                    "package.module:function or path/to/file.py:function).")
flags.DEFINE_integer("batch_size", 256, "Global batch.")
flags.DEFINE_integer("steps", 60, "Timed steps per epoch (an epoch window).")
flags.DEFINE_integer("epochs", 3, "Epochs per run; the first is warm-up and not counted.")
flags.DEFINE_integer("rounds", 2, "Interleaved rounds over all configurations.")
flags.DEFINE_boolean("allreduce", False, "Also run the allreduce micro-benchmark.")
flags.DEFINE_list("allreduce_sizes", None, "Allreduce sizes in bytes (default 4K..64M).")
flags.DEFINE_boolean("cadence", False, "Also run section 12.2's experiment on 2 devices: the "
                     "bare step, tfdp's loop at each --sync_every, no barrier at all, and "
                     "gradient accumulation's memory (tfdp.bench.cadence; cadence.md, .json).")
flags.DEFINE_list("cadence_configs", None, "--cadence: mode:batch[:sync=N][:acc=K] entries "
                  "(default: tfdp.bench.cadence.DEFAULT_CONFIGS).")
flags.DEFINE_boolean("hosts", False, "Across emulated hosts (Linux, root) instead of one "
                     "machine: the training table (configs manual:k[:allreduce], multi_worker:k, "
                     "parameter_server:k[:ps=n]; "
                     f"default {HOSTS_CONFIGS} with --steps=20 --epochs=2 --rounds=1) and, with "
                     "--allreduce, the allreduce table.")
flags.DEFINE_list("workers", ["2", "3", "4"], "--hosts, --elastic: worker counts k to try.")
flags.DEFINE_boolean("elastic", False, "Measure what tfdp.launch --num_workers=1:k costs, with "
                     "nothing lost and with a worker lost (tfdp.bench.elastic; elastic.md, .json).")
flags.DEFINE_integer("elastic_step_rounds", 15, "--elastic: rounds of the CPU each example "
                     "costs multi_worker's step with and without a survivor's marks "
                     "(tfdp.bench.whole_step_cost); 0: not measured.")
flags.DEFINE_list("elastic_paths", ["multi_worker"], "--elastic: the paths to measure "
                  "(multi_worker, manual: the from-scratch client's servers).")
flags.DEFINE_list("sizes", ["0.5MB", "4MB"], "--hosts: gradient sizes (0.43MB, 4MB, 45MB ...).")
flags.DEFINE_list("dtypes", ["float32"], "--hosts --allreduce: what the gradients travel in "
                  "(float32, bfloat16: tfdp.train's --allreduce_dtype); --sizes are float32 bytes.")
flags.DEFINE_list("links", ["10mbit", "100mbit", "1gbit"],
                  "--hosts: link rates, each way (tc syntax).")
flags.DEFINE_integer("repeats", 5, "--hosts: timed allreduce calls per row, after a warm-up.")
flags.DEFINE_integer("pieces", PIECES, "--hosts --allreduce: equal parameters tfdp's gradient "
                     f"is cut into ({PIECES}: sharded is balanced on 2, 3 and 4 workers; 1: one "
                     "tensor, so add_n's gather and broadcast cannot overlap).")
flags.DEFINE_float("time_to_accuracy", None, "Measure the seconds to this test accuracy "
                   "instead of throughput: --runs runs of each --tta_configs entry "
                   "(tfdp.bench.time_to_accuracy; time_to_accuracy.md, .json, .png).")
flags.DEFINE_list("tta_configs", TTA_CONFIGS,
                  "--time_to_accuracy: path:devices[:recipe][:e=epochs][:flag=value...] entries "
                  "(flag: any other tfdp.train flag, e.g. manual:2:fast:momentum=0).")
flags.DEFINE_integer("runs", 5, "--time_to_accuracy: runs (seeds 1..runs) per configuration.")
flags.DEFINE_integer("tta_steps", None, "--time_to_accuracy: cap on steps per epoch (tests).")
flags.DEFINE_integer("tta_eval_examples", None, "--time_to_accuracy: cap on test examples "
                     "(tests; MLPerf evaluates the whole test set, the default).")
flags.DEFINE_string("workdir", os.path.join("runs", "bench"), "Where the table, JSON and chart go.")
flags.DEFINE_string("data_dir", None, "TFDS data dir (as for tfdp.train).")
flags.DEFINE_string("manual_dir", None, "Fashion-MNIST .gz folder (as for tfdp.train).")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    if FLAGS.hosts:
        return main_hosts()
    if FLAGS.time_to_accuracy is not None:
        return main_time_to_accuracy()
    if FLAGS.elastic:
        from tfdp.bench import elastic
        return elastic.main(FLAGS)
    try:
        configs = [parse_config(c) for c in FLAGS.configs if c.strip()]
        model_spec.check_spec(FLAGS.model)
        if FLAGS.epochs < 2:
            raise UserError(f"--epochs={FLAGS.epochs}: the first epoch is warm-up and not "
                            "timed; give at least 2")
        for config in configs:
            check_command(config["name"], train_command(config, FLAGS.workdir, FLAGS))
    except ValueError as e:  # tfdp's UserError is one.
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
                    samples[config["name"]] += run_once(config, FLAGS)
                except RuntimeError as e:
                    sys.exit(f"tfdp.bench: error: {e}")
        from tfdp.util import logs

        logs.configure(False)
        logs.import_tensorflow()  # The ceilings are measured here: its start-up banners hidden.
        from tfdp.util.devices import matmul_gflops

        ceilings = {dtype: matmul_gflops(dtype) for dtype in ("float32", "bfloat16")}
        flops = training_flops_per_example(FLAGS.model)
        rows = summarise(configs, samples, ceilings, flops)
        report.update(matmul_gflops=ceilings["float32"], matmul_gflops_by_dtype=ceilings,
                      training_flops_per_example=flops, rows=rows, samples=samples)
        text.append(format_table(rows, ceilings, flops, FLAGS))
        plot(rows, os.path.join(FLAGS.workdir, "bench.png"), FLAGS)
    if FLAGS.cadence:
        text.append(_cadence())
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
            launch = host_training.Launch(FLAGS.batch_size, setting("steps"), setting("epochs"),
                                          FLAGS.data_dir, FLAGS.manual_dir)
            rows = host_training.measure(configs, FLAGS.links, launch, setting("rounds"),
                                         say=say)
            write_table(os.path.join(FLAGS.workdir, "training_hosts"), rows,
                        host_training.format_rows(rows))
            text.append(host_training.format_rows(rows))
            overlap = host_training.format_overlap(rows)
            if overlap.count("\n") > 2:  # Rows with an overlap=none twin.
                text.append(overlap)
        if FLAGS.allreduce:
            rows = host_allreduce.measure(workers, sizes, FLAGS.links, FLAGS.repeats, say=say,
                                          dtypes=dtypes, pieces=FLAGS.pieces)
            base = os.path.join(FLAGS.workdir, "allreduce_hosts")
            write_table(base, rows, host_allreduce.format_rows(rows))
            host_allreduce.plot(rows, base + ".png")
            text.append(host_allreduce.format_rows(rows))
    except (UserError, ValueError) as e:
        sys.exit(f"tfdp.bench: error: {e}")
    print("\n\n".join(text))
    print(f"\nwritten in {FLAGS.workdir}: "
          + ", ".join(["training_hosts.md, .json"] * bool(configs)
                      + ["allreduce_hosts.md, .json, .png"] * FLAGS.allreduce))


def main_time_to_accuracy():
    """``--time_to_accuracy``: ``tfdp.bench.time_to_accuracy``'s table, written as
    time_to_accuracy.md, .json and .png in --workdir."""
    from tfdp.bench import time_to_accuracy as tta
    from tfdp.util import logs

    target = FLAGS.time_to_accuracy
    try:
        if not 0 < target <= 1:
            raise UserError(f"--time_to_accuracy must be a fraction in (0, 1], got {target}")
        if FLAGS.runs < 1:
            raise UserError(f"--runs must be a positive integer, got {FLAGS.runs}")
        configs = [tta.parse(c) for c in FLAGS.tta_configs if c.strip()]
        if not configs:
            raise UserError("--tta_configs is empty: give at least one path:devices entry")
        for config in configs:
            check_command(config["name"], tta.command(config, FLAGS.workdir, target, 1, FLAGS))
        os.makedirs(FLAGS.workdir, exist_ok=True)
        rows = tta.measure(configs, target, FLAGS.runs, FLAGS,
                           say=lambda line: print(f"tfdp.bench: {line}", flush=True))
    except UserError as e:
        sys.exit(f"tfdp.bench: error: {e}")
    logs.configure(False)
    logs.import_tensorflow()  # The ceiling is measured here: its start-up banners hidden.
    from tfdp.bench.configs import training_flops_per_example
    from tfdp.util.devices import matmul_gflops

    ceilings = {dtype: matmul_gflops(dtype) for dtype in ("float32", "bfloat16")}
    tta.floors(rows, ceilings, training_flops_per_example)
    table = tta.format_rows(rows, ceilings)
    base = os.path.join(FLAGS.workdir, "time_to_accuracy")
    write_table(base, {"matmul_gflops": ceilings, "rows": rows}, table)
    tta.plot(rows, base + ".png")
    print(table)
    print(f"\nwritten in {FLAGS.workdir}: time_to_accuracy.md, .json, .png")


def _cadence() -> str:
    """``--cadence``: ``tfdp.bench.cadence``'s table, written as cadence.md and .json."""
    from tfdp.bench import cadence

    try:
        configs = [cadence.parse(c) for c in
                   (FLAGS.cadence_configs or cadence.DEFAULT_CONFIGS.split(",")) if c.strip()]
        rows = cadence.measure(configs, FLAGS.steps, FLAGS.epochs, FLAGS.rounds, FLAGS.data_dir,
                               FLAGS.manual_dir,
                               say=lambda line: print(f"tfdp.bench: {line}", flush=True))
    except UserError as e:
        sys.exit(f"tfdp.bench: error: {e}")
    table = cadence.format_rows(rows)
    write_table(os.path.join(FLAGS.workdir, "cadence"), rows, table)
    return table


def run():
    app.run(main, flags_parser=help_parser("tfdp.bench", __doc__, [__name__]))


if __name__ == "__main__":
    run()
