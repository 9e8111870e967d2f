"""Section 12.2's experiment on the from-scratch path: the host's share of a step, the cadence of
synchronisation, running ahead with no barrier at all, and the memory of gradient accumulation.

  python -m tfdp.bench --configs= --cadence              # the tables of docs/section-12.2.md
  python -m tfdp.bench --configs= --cadence --cadence_configs=bare:32,loop:32:sync=16

A configuration is ``mode:batch[:option...]`` on 2 devices, each measured in a process of its
own (its peak memory is its own), in interleaved rounds:

* ``bare``: the compiled step (``tfdp.paths.manual.step``) called back to back on batches made in
  memory beforehand, read once at the end: the step with no host in it.
* ``loop``: tfdp's own epoch loop (``tfdp.training.loop``) on the real input pipeline, reading
  losses, accuracy and finiteness every ``sync=N`` steps (``--sync_every``; ``sync=1``: a
  barrier each step, the book's first experiment).
* ``ahead``: the bare step issued with no barrier at all, under TensorFlow's asynchronous eager
  execution (the host runs ahead of the devices until the one read at the end: the book's
  second experiment).

Options: ``sync=N``, ``acc=K`` (``--accumulate_steps``: a step is then an update of K
micro-batches of ``batch``). Each row: time per step (median over the timed epochs), and peak
memory above the idle process: the peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs`` once the data is loaded and the replicas are placed) minus the
resident set at that moment.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tfdp.bench import entries
from tfdp.util.errors import UserError

DEVICES = 2
MODES = ("bare", "loop", "ahead")
DEFAULT_CONFIGS = ("bare:32,loop:32:sync=1,loop:32:sync=4,loop:32:sync=16,loop:32:sync=64,"
                   "ahead:32,bare:256,loop:256:sync=1,loop:256:sync=16,ahead:256,"
                   "bare:2048,bare:256:acc=8,loop:2048:sync=16,loop:256:sync=16:acc=8")


def parse(text: str) -> dict:
    form = (f"expected mode:batch[:sync=N][:acc=K] with mode in {', '.join(MODES)} and batch "
            f">= {DEVICES}")
    entry = entries.parse(text, "--cadence_configs", MODES, form)
    if entry.count < DEVICES:
        raise entry.refuse(form)
    config = {"name": entry.text, "mode": entry.path, "batch": entry.count, "sync": 1, "acc": 1}
    for word in entry.words:
        raise entry.refuse(f"unknown option {word!r} (sync=N, acc=K)")
    for name, value in entry.settings.items():
        if name not in ("sync", "acc") or not value.isdigit() or int(value) < 1:
            raise entry.refuse(f"unknown option {f'{name}={value}'!r} (sync=N, acc=K)")
        config[name] = int(value)
    if config["mode"] != "loop" and config["sync"] > 1:
        raise entry.refuse("sync=N is the loop's")
    return config


def measure(configs: list, steps: int, epochs: int, rounds: int, data_dir=None,
            manual_dir=None, say=print) -> list:
    """One row per configuration: its medians over rounds, and the host's share beside the
    bare step of the same batch."""
    if epochs < 2:
        raise UserError("--epochs must be 2 or more with --cadence: the first (tracing) is not "
                        "timed")
    runs = {c["name"]: [] for c in configs}
    for round_ in range(rounds):
        for config in configs:
            say(f"round {round_ + 1}/{rounds}: {config['name']} ...")
            runs[config["name"]].append(_run(config, steps, epochs, data_dir, manual_dir))
    rows = []
    for config in configs:
        done = runs[config["name"]]
        rows.append(dict(config, steps=steps, step_seconds=statistics.median(
            s for run in done for s in run["step_seconds"]),
            peak_mb=statistics.median(run["peak_mb"] for run in done),
            samples=done))
    for row in rows:
        bare = next((r for r in rows if r["mode"] == "bare" and r["batch"] == row["batch"]
                     and r["acc"] == row["acc"]), None)
        row["of_bare"] = bare["step_seconds"] / row["step_seconds"] if bare else None
    return rows


def format_rows(rows: list) -> str:
    lines = [f"section 12.2 on {DEVICES} devices: time per step (an update, with acc=K), its "
             "rate as a fraction of the bare compiled step's at the same batch, and peak memory "
             "above the idle process",
             "| config | mode | batch | sync every | accumulate | step | of bare step's rate "
             "| peak memory above idle |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        share = "-" if r["of_bare"] is None else f"{r['of_bare']:.3f}"
        lines.append(f"| {r['name']} | {r['mode']} | {r['batch']} | "
                     f"{r['sync'] if r['mode'] == 'loop' else '-'} | {r['acc']} | "
                     f"{r['step_seconds'] * 1e3:.2f} ms | {share} | {r['peak_mb']:.1f} MB |")
    return "\n".join(lines)


def _run(config: dict, steps: int, epochs: int, data_dir, manual_dir) -> dict:
    command = [sys.executable, "-m", "tfdp.bench.cadence", json.dumps(
        {"config": config, "steps": steps, "epochs": epochs, "data_dir": data_dir,
         "manual_dir": manual_dir})]
    result = subprocess.run(command, capture_output=True, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"{config['name']} failed: {tail}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# --- In the measuring process ------------------------------------------------------------------

def _resident_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> float:
    """Reset the peak resident set to the current one (Linux); return the current one."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _resident_mb("VmRSS")


def _measure_one(config: dict, steps: int, epochs: int, data_dir, manual_dir) -> dict:
    from tfdp.util import logs

    logs.import_tensorflow()
    from tfdp.config.settings import Config
    from tfdp.data import pipeline, sources
    from tfdp.util.devices import configure_devices

    devices = configure_devices(DEVICES)
    train, test = pipeline.load_splits(sources.prepare(data_dir=data_dir, manual_dir=manual_dir))
    with tempfile.TemporaryDirectory(prefix="tfdp-bench-cadence-") as workdir:
        settings = Config(num_gpus=DEVICES, batch_size=config["batch"], epochs=epochs,
                          steps_per_epoch=steps, eval_steps=1, init="glorot", workdir=workdir,
                          sync_every=config["sync"], accumulate_steps=config["acc"],
                          data_dir=data_dir, manual_dir=manual_dir)
        if config["mode"] == "loop":
            return _loop(settings, train, test)
        return _bare(settings, devices, train, asynchronous=config["mode"] == "ahead")


def _loop(config, train, test) -> dict:
    """The loop as a run takes it, through the one entry that trains (no export)."""
    from tfdp.training import entry

    idle = _reset_peak()
    result = entry.train(config, splits=(train, test), export=False)
    peak = _resident_mb("VmHWM")
    steps = result.plan.steps_per_epoch
    return {"step_seconds": [r["seconds"] / steps for r in result.history[1:]],
            "peak_mb": peak - idle}


def _bare(config, devices, train, asynchronous: bool) -> dict:
    import tensorflow as tf
    from tensorflow.python.eager import context

    from tfdp.config.plan import make_plan
    from tfdp.data import pipeline
    from tfdp.models import lenet
    from tfdp.paths.manual.replicate import Replicas
    from tfdp.paths.manual.step import StepSettings, make_train_step

    plan = make_plan(config, DEVICES, len(train.labels), 1)
    batches = list(pipeline.train_batches(train, plan.global_batch, config.seed, 0, 1,
                                      plan.steps_per_epoch))
    replicas = Replicas.place(lenet.start_params("glorot", config.seed), devices)
    step = make_train_step(replicas, StepSettings(accumulate=config.accumulate_steps))
    lr = tf.constant(0.05)
    idle = _reset_peak()
    seconds = []
    for _ in range(config.epochs):
        start = time.perf_counter()
        with context.execution_mode(context.ASYNC if asynchronous else context.SYNC):
            for batch in batches:
                loss = step(*batch, lr)[0]
            float(loss)  # The one read: waits for every step issued.
            context.async_wait()
        seconds.append((time.perf_counter() - start) / len(batches))
    return {"step_seconds": seconds[1:], "peak_mb": _resident_mb("VmHWM") - idle}


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    print(json.dumps(_measure_one(request["config"], request["steps"], request["epochs"],
                                  request["data_dir"], request["manual_dir"])))
