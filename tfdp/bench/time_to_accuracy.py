"""``python -m tfdp.bench --time_to_accuracy=A``: time to a target test accuracy, measured as
MLPerf Training measures it (docs/time-to-accuracy.md).

Every run is a real process with its own seed: ``tfdp.train --target_accuracy=A`` (its clock:
``tfdp.training.clock``), or a Keras script a user would write (``tfdp.bench.references``: the
beginner's CNN, the tuned reference), timed by the same clock. Runs are interleaved, seed by
seed over every configuration, so the machine's noise spreads over all of them alike. Per
configuration, as MLPerf scores a benchmark: of its runs, drop the fastest and the slowest and
average the rest (with fewer than 3 runs, average them all); a configuration scores only if
every run reached the target. Beside the score: the examples trained to reach the target, the
training examples/s, and the **arithmetic floor**, the seconds the examples trained would take
at the machine's matmul ceiling in the run's precision (measured by the bench in the same run):
examples x training FLOPs per example / ceiling.

A configuration is ``path:devices[:option...]``: path is manual, mirrored, multi_worker,
plain (tfdp.train's strategies), beginner or keras_tuned (the references, one device); options
are a recipe (``fast`` or ``textbook``; default fast), ``e=N``, the run's epochs (the one-cycle
schedule's length; default: the recipe's, as ``tfdp.train`` runs it, or the reference's own),
and ``flag=value``, any other ``tfdp.train`` flag, so that one bench runs an ablation side by
side (``manual:2:fast:label_smoothing=0``).
"""

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from tfdp import paths
from tfdp.bench import entries
from tfdp.bench.configs import path_command
from tfdp.config.recipes import RECIPES
from tfdp.config.settings import Config
from tfdp.util import charts
from tfdp.util.errors import UserError

# The Keras scripts (tfdp.bench.references), beside tfdp.train's paths: name -> --reference.
REFERENCES = {"beginner": "beginner", "keras_tuned": "tuned"}
# The textbook's row times its step, for the fast step's examples/s against it.
DEFAULT_CONFIGS = ("manual:2:fast,mirrored:2:fast,plain:1:fast,manual:2:textbook:e=2,"
                   "keras_tuned:1,beginner:1")
# What the bench sets itself, per run or from its own flags.
BENCH_SETS = {"strategy", "num_gpus", "recipe", "seed", "target_accuracy", "epochs", "workdir",
              "export_dir", "data_dir", "manual_dir", "steps_per_epoch", "eval_steps"}
TRAIN_FLAGS = {field.name for field in dataclasses.fields(Config)} - BENCH_SETS


def parse(text: str) -> dict:
    entry = entries.parse(text, "--tta_configs", (*paths.names(), *REFERENCES))
    reference = entry.path in REFERENCES
    config = {"name": entry.text, "path": entry.path, "devices": entry.count,
              "recipe": "fast", "epochs": None, "train_flags": {}}
    for word in entry.words:
        if word not in ("fast", "textbook"):
            raise entry.refuse(f"unknown option {word!r}")
        config["recipe"] = word
    for name, value in entry.settings.items():
        if name == "e" and value.isdigit() and int(value) > 0:
            config["epochs"] = int(value)
        elif name in TRAIN_FLAGS and value and not reference:
            config["train_flags"][name] = value
        elif name in BENCH_SETS:
            raise entry.refuse(f"the bench sets --{name} itself")
        else:
            raise entry.refuse(f"unknown option {f'{name}={value}'!r}")
    if reference:
        if entry.count != 1:
            raise entry.refuse("the Keras references run on 1 device")
        config["recipe"] = "-"
    return config


def command(config: dict, workdir: str, target: float, seed: int, settings) -> list:
    """The command of one run of ``config`` (``settings``: the bench's flags)."""
    data = ([f"--data_dir={settings.data_dir}"] * bool(settings.data_dir)
            + [f"--manual_dir={settings.manual_dir}"] * bool(settings.manual_dir))
    steps = [f"--steps_per_epoch={settings.tta_steps}"] * bool(settings.tta_steps)
    if config["path"] in REFERENCES:
        return [sys.executable, "-m", "tfdp.bench.references",
                f"--reference={REFERENCES[config['path']]}", f"--workdir={workdir}",
                f"--target_accuracy={target}", f"--seed={seed}",
                *[f"--epochs={config['epochs']}"] * bool(config["epochs"]), *data, *steps,
                *([f"--eval_examples={settings.tta_eval_examples}"]
                  * bool(settings.tta_eval_examples))]
    args = [f"--recipe={config['recipe']}", f"--seed={seed}", f"--target_accuracy={target}",
            *[f"--epochs={config['epochs']}"] * bool(config["epochs"]), f"--workdir={workdir}",
            f"--export_dir={workdir}/export", *data, *steps,
            *(f"--{name}={value}" for name, value in config["train_flags"].items())]
    if settings.tta_eval_examples:  # Tests only: MLPerf evaluates the whole test set.
        args.append(f"--eval_steps={_eval_steps(config, settings)}")
    return path_command(config["path"], config["devices"], args)


def _eval_steps(config, settings) -> int:
    batch = config["train_flags"].get("batch_size", RECIPES[config["recipe"]]["batch_size"])
    return max(1, settings.tta_eval_examples // int(batch))


def model_of(config: dict) -> str:
    """The model a configuration trains (a built-in's name, or a reference's)."""
    if config["path"] in REFERENCES:
        return REFERENCES[config["path"]]
    return config["train_flags"].get("model", RECIPES[config["recipe"]]["model"])


def run_once(config: dict, target: float, seed: int, settings) -> dict:
    """One run: its seed, the seconds to the target (None if not reached), its curve of
    (clock seconds, test accuracy) per epoch, the examples trained to the target, its last
    epoch's training examples/s, its precision and its start-up."""
    workdir = tempfile.mkdtemp(prefix="tfdp-tta-")
    try:
        result = subprocess.run(command(config, workdir, target, seed, settings),
                                capture_output=True, text=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        if result.returncode != 0:
            tail = result.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise UserError(f"{config['name']} (seed {seed}) failed: {tail[0]}")
        with open(os.path.join(workdir, "metrics.json")) as f:
            metrics = json.load(f)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    epochs = metrics["epochs"]
    curve = [(e["clock_s"], e["test_acc"]) for e in epochs]
    reached = metrics.get("reached_at_epoch")
    return {"seed": seed, "seconds": curve[reached - 1][0] if reached else None,
            "epochs": reached, "curve": curve, "startup_s": metrics.get("startup_s"),
            "examples": sum(e["examples"] for e in epochs[:reached]) if reached else None,
            # The last epoch's: the first one's holds the step's compilation.
            "examples_per_sec": epochs[-1]["examples_per_sec"],
            "precision": metrics.get("precision", "float32")}


def mlperf_mean(seconds: list):
    """MLPerf's score of a benchmark's runs: drop the fastest and the slowest, average the rest
    (all of them with fewer than 3); None unless every run reached the target."""
    if not seconds or any(s is None for s in seconds):
        return None
    kept = sorted(seconds)[1:-1] if len(seconds) >= 3 else seconds
    return statistics.mean(kept)


def measure(configs: list, target: float, runs: int, settings, say=print) -> list:
    """Every configuration ``runs`` times, seeds 1..runs, interleaved; one row each (its
    arithmetic floor: ``floors``)."""
    samples = {c["name"]: [] for c in configs}
    for seed in range(1, runs + 1):
        for config in configs:
            say(f"time to {target}: seed {seed}/{runs}: {config['name']} ...")
            run = run_once(config, target, seed, settings)
            samples[config["name"]].append(run)
            say(f"  reached in {run['seconds']:.1f} s (epoch {run['epochs']})"
                if run["seconds"] is not None else "  did not reach it")
    rows = []
    for config in configs:
        done = samples[config["name"]]
        seconds = [r["seconds"] for r in done]
        reached = [s for s in seconds if s is not None]
        epochs = [r["epochs"] for r in done if r["epochs"]]
        examples = [r["examples"] for r in done if r["examples"]]
        rows.append(dict(config, target=target, runs=done, score_s=mlperf_mean(seconds),
                         reached=len(reached), min_s=min(reached, default=None),
                         max_s=max(reached, default=None),
                         median_epochs=statistics.median(epochs) if epochs else None,
                         startup_s=statistics.median([r["startup_s"] or 0 for r in done]),
                         examples=statistics.median(examples) if examples else None,
                         examples_per_sec=statistics.median(
                             [r["examples_per_sec"] for r in done]),
                         precision=done[0]["precision"]))
    return rows


def floors(rows: list, ceilings: dict, flops_per_example) -> None:
    """Each scored row's arithmetic floor (``floor_s``: its median examples to the target x
    ``flops_per_example(model)`` / the matmul ceiling of its precision, ``ceilings``: GFLOP/s
    by dtype name) and its score's multiple of it (``of_floor``)."""
    for row in rows:
        row["floor_s"] = row["of_floor"] = None
        if row["examples"] and row["precision"] in ceilings:
            row["flops_per_example"] = flops_per_example(model_of(row))
            row["floor_s"] = (row["examples"] * row["flops_per_example"]
                              / (ceilings[row["precision"]] * 1e9))
            if row["score_s"]:
                row["of_floor"] = row["score_s"] / row["floor_s"]


def format_rows(rows: list, ceilings: dict = None) -> str:
    """The table: each configuration's score, what it trained to get there, its multiple of the
    arithmetic floor, and how many times faster than the references (the beginner's CNN, the
    tuned Keras reference) it is; then the fast step's examples/s against the textbook's."""
    target = rows[0]["target"]
    refs = {name: next((r["score_s"] for r in rows if r["path"] == name), None)
            for name in REFERENCES}
    head = (f"time to {target} test accuracy (MLPerf's mean: the fastest and slowest of each "
            f"configuration's runs dropped), {len(rows[0]['runs'])} runs each"
            + ("; matmul ceilings " + ", ".join(f"{g:.0f} GFLOP/s {d}" for d, g in
                                                ceilings.items()) if ceilings else ""))
    lines = [head, "",
             "| config | recipe | reached | seconds to target | min-max | epochs (median) "
             "| examples to target | training examples/s | x the arithmetic floor | start-up s "
             "| x faster than the beginner's CNN | x faster than the tuned Keras reference |",
             "| --- " * 12 + "|"]

    def times(ref, score):
        return f"{ref / score:.2f}" if ref and score else "-"

    for r in rows:
        score = f"{r['score_s']:.1f}" if r["score_s"] else "-"
        spread = f"{r['min_s']:.1f}-{r['max_s']:.1f}" if r["min_s"] else "-"
        floor = (f"{r['of_floor']:.1f} ({r['floor_s']:.1f} s, {r['precision']})"
                 if r.get("of_floor") else "-")
        lines.append(f"| {r['name']} | {r['recipe']} | {r['reached']}/{len(r['runs'])} | "
                     f"{score} | {spread} | {_number(r['median_epochs'])} | "
                     f"{_number(r['examples'])} | {r['examples_per_sec']:.0f} | {floor} | "
                     f"{r['startup_s']:.1f} | {times(refs['beginner'], r['score_s'])} | "
                     f"{times(refs['keras_tuned'], r['score_s'])} |")
    for fast, textbook in step_pairs(rows):
        lines.append(f"\nThe fast step on {fast['path']}:{fast['devices']}: "
                     f"{fast['examples_per_sec'] / textbook['examples_per_sec']:.2f}x the "
                     f"textbook step's examples/s ({fast['examples_per_sec']:.0f} against "
                     f"{textbook['examples_per_sec']:.0f}, each run's last epoch, median).")
    return "\n".join(lines)


def step_pairs(rows: list) -> list:
    """(fast row, textbook row) of the same path and devices, neither with flags of its own."""
    plain = [r for r in rows if r["path"] not in REFERENCES and not r["train_flags"]]
    return [(f, t) for f in plain for t in plain if f["recipe"] == "fast"
            and t["recipe"] == "textbook" and (f["path"], f["devices"]) == (t["path"],
                                                                           t["devices"])]


def _number(value) -> str:
    return "-" if value is None else f"{value:g}"


def plot(rows: list, path: str) -> None:
    """Test accuracy against seconds on the clock, every run of every configuration."""
    fig = charts.figure(8, 5)
    ax = fig.subplots()
    for i, r in enumerate(rows):
        color = f"C{i % 10}"
        for j, run in enumerate(r["runs"]):
            seconds, accuracy = zip(*run["curve"]) if run["curve"] else ((), ())
            ax.plot(seconds, accuracy, "o-", color=color, alpha=0.6, markersize=3,
                    label=r["name"] if j == 0 else None)
    ax.axhline(rows[0]["target"], color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("seconds on the clock (data loading, compiling and evaluations included)")
    ax.set_ylabel("test accuracy")
    lowest = min((a for r in rows for run in r["runs"] for _, a in run["curve"]), default=0)
    ax.set_ylim(max(0.0, min(lowest, rows[0]["target"] - 0.1) - 0.02), 1.0)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
