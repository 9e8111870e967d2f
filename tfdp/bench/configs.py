"""The benchmark's configurations (``path:devices[:option...]``), each run once as a real
process, and the machine's ceilings its rows are held against."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl import flags

from tfdp import paths
from tfdp.bench import entries
from tfdp.config.checks import parse_interval
from tfdp.config.flags import config_from_args
from tfdp.paths.manual import algorithms
from tfdp.util.errors import UserError

STOCK = "stock"  # Keras' own defaults (tfdp.bench.stock), beside tfdp.train's paths.


def path_names() -> tuple:
    """What a configuration may name: every registered --strategy, and ``stock``."""
    return (*paths.names(), STOCK)


def parse_config(text: str) -> dict:
    entry = entries.parse(text, "--configs", path_names())
    own = paths.get(entry.path).own_flags if entry.path != STOCK else {}
    config = {"name": entry.text, "path": entry.path, "devices": entry.count,
              "allreduce": own["allreduce"].off[0] if "allreduce" in own else "-",
              "eager": False, "jit": False, "spe": 1, "precision": "float32", "intra": None,
              "inter": None, "backup": None}
    for word in entry.words:
        if word in algorithms.NAMES:
            if "allreduce" not in own:
                raise entry.refuse(f"--strategy={entry.path} has no allreduce of its own to "
                                   "choose")
            config["allreduce"] = word
        elif word in ("eager", "jit"):
            config[word] = True
        elif word in ("bf16", "bfloat16"):
            config["precision"] = "bfloat16"
        else:
            raise entry.refuse(f"unknown option {word!r}")
    for name, value in entry.settings.items():
        if name == "backup":  # --backup_every: what backing up within an epoch costs.
            try:
                parse_interval(value)
            except ValueError:
                raise entry.refuse(f"backup={value}: give steps (16), a time (30s) or 0") from None
            config[name] = value
            continue
        if name not in ("spe", "intra", "inter") or not value.isdigit() or int(value) < 1:
            raise entry.refuse(f"unknown option {f'{name}={value}'!r}")
        config[name] = int(value)
    if entry.path == STOCK and (config["precision"] != "float32" or config["spe"] > 1):
        raise entry.refuse("stock is Keras' defaults (float32, one step per execution); tune "
                           "plain:1 instead")
    return config


def train_command(config: dict, workdir: str, settings) -> list:
    """The command that runs ``config`` once (``settings``: the benchmark's flags)."""
    if config["path"] == STOCK:
        return [sys.executable, "-m", "tfdp.bench.stock", f"--workdir={workdir}",
                f"--model={settings.model}",
                f"--batch_size={settings.batch_size}", f"--epochs={settings.epochs}",
                f"--steps={settings.steps}",
                *(["--synthetic"] if settings.data == "synthetic" else []),
                *([f"--data_dir={settings.data_dir}"] if settings.data_dir else [])]
    args = [f"--model={settings.model}", f"--batch_size={settings.batch_size}",
            f"--epochs={settings.epochs}", f"--steps_per_epoch={settings.steps}", "--eval_steps=1",
            "--init=glorot", f"--workdir={workdir}", f"--export_dir={workdir}/export"]
    args += [f"--data_dir={settings.data_dir}"] * bool(settings.data_dir)
    args += [f"--manual_dir={settings.manual_dir}"] * bool(settings.manual_dir)
    args += ["--synthetic_data"] * (settings.data == "synthetic")
    args += ["--eager"] * config["eager"]
    args += ["--jit_compile"] * config["jit"]
    args += [f"--precision={config['precision']}"]
    if config["allreduce"] != "-":
        args.append(f"--allreduce={config['allreduce']}")
    if config["spe"] > 1:
        args.append(f"--steps_per_execution={config['spe']}")
    if config["backup"] is not None:
        args.append(f"--backup_every={config['backup']}")
    return path_command(config["path"], config["devices"], args)


def path_command(strategy: str, count: int, args: list) -> list:
    """``tfdp.train`` on ``count`` devices, or ``tfdp.launch`` of ``count`` workers of one
    device each where the path scales by workers (``tfdp.paths.Path.scales_by``)."""
    if paths.get(strategy).scales_by == "workers":
        return [sys.executable, "-m", "tfdp.launch", f"--num_workers={count}", "--",
                f"--strategy={strategy}", "--num_gpus=1", *args]
    return [sys.executable, "-m", "tfdp.train", f"--strategy={strategy}", f"--num_gpus={count}",
            *args]


def check_command(name: str, command: list) -> None:
    """Before any run starts: ``tfdp.train``'s own one-line refusal of the arguments of
    ``command`` (a ``path_command``), as a ``UserError`` naming the configuration ``name``."""
    module = next((m for m in ("tfdp.train", "tfdp.launch") if m in command), None)
    if module is None:
        return  # Keras' own scripts (stock, the references) take only the bench's flags.
    args = command[command.index("--" if module == "tfdp.launch" else module) + 1:]
    try:
        config_from_args(args)
    except (UserError, flags.Error) as e:
        raise UserError(f"{name}: {e}") from None


def run_once(config: dict, settings) -> list:
    """Examples/s of each timed (non-first) epoch of one run."""
    workdir = tempfile.mkdtemp(prefix="tfdp-bench-")
    try:
        threads = {name: str(config[key]) for key, name in (
            ("intra", "TF_NUM_INTRAOP_THREADS"), ("inter", "TF_NUM_INTEROP_THREADS"))
            if config[key]}
        result = subprocess.run(train_command(config, workdir, settings), capture_output=True,
                                text=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **threads))
        if result.returncode != 0:
            tail = result.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise RuntimeError(f"{config['name']} failed: {tail[0]}")
        with open(os.path.join(workdir, "metrics.json")) as f:
            epochs = json.load(f)["epochs"]
        return [e["examples_per_sec"] for e in epochs[1:]]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def training_flops_per_example(model_name: str) -> float:
    """Forward multiply-adds of conv and dense layers x 2 FLOPs, x 3 for forward + backward
    (``model_name``: a built-in or your model's spec, or a Keras reference's, ``beginner`` or
    ``tuned`` (``tfdp.bench.references``), on Fashion-MNIST's images)."""
    from tfdp.bench import references
    from tfdp.models import catalog

    builders = {"beginner": references.beginner_model, "tuned": references.tuned_model}
    if model_name in builders:
        return keras_training_flops(builders[model_name]())
    return keras_training_flops(catalog.build(model_name, (28, 28, 1), 10))


def keras_training_flops(model) -> float:
    """``training_flops_per_example`` of a built Keras ``model``."""
    import keras

    forward = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw, cin, cout = layer.kernel.shape
            _, h, w, _ = layer.output.shape
            forward += 2 * h * w * cout * kh * kw * cin
        elif isinstance(layer, keras.layers.Dense):
            forward += 2 * layer.kernel.shape[0] * layer.kernel.shape[1]
    return 3.0 * forward
