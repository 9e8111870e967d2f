"""Every check of ``tfdp.config.settings.Config``, each written once: the flags every run has, the
recipe's, the cadence flags of section 12.2, then what ``--strategy``'s path takes (its models,
its own flags, its refusals: each path declares them, ``tfdp.paths``). ``check(config)``
runs them all in that order, before any device, data or model work, and each refusal is one
line naming the flag to change.
"""

import dataclasses
import math
import os
import re
import typing

from tfdp import paths
from tfdp.config import dataset_spec, model_spec
from tfdp.config import optimizer_spec as optimizers
from tfdp.util.errors import UserError

INITS = ("textbook", "glorot")
PRECISIONS = ("float32", "float64", "bfloat16", "auto")


def choice(flag, value, choices):
    if value not in choices:
        raise UserError(f"--{flag}={value} is not one of: {', '.join(choices)}")


def positive(flag, value):
    if not isinstance(value, int) or value <= 0:
        raise UserError(f"--{flag} must be a positive integer, got {value}")


def parse_steps(text: str) -> tuple:
    """``"A:B"`` or ``"A"`` -> (A, B), global steps counted from 1; ValueError when not."""
    first, colon, last = text.partition(":")
    first = int(first)
    last = int(last) if colon else first
    if first < 1 or last < first:
        raise ValueError(text)
    return first, last


_UNITS = {"s": 1, "m": 60, "h": 3600}
_INTERVAL = re.compile(r"^(?P<count>\d+(\.\d+)?)(?P<unit>[smh]?)$")


def parse_interval(text: str) -> tuple:
    """``--backup_every``: ``"500"`` -> (500, None) steps; ``"10m"`` -> (None, 600.0) seconds
    (s, m, h); ``"0"`` -> (None, None): never within an epoch. ValueError when none of these."""
    match = _INTERVAL.match(str(text).strip())
    if not match or (not match["unit"] and match[2]):  # Steps are whole.
        raise ValueError(text)
    count, unit = float(match["count"]), match["unit"]
    if count == 0:
        return None, None
    return (None, count * _UNITS[unit]) if unit else (int(count), None)


def check(config) -> None:
    """All of a configuration's checks (its aliases already resolved)."""
    types(config)
    common(config)
    recipe(config)
    cadence(config)
    the_path(config)


def types(config) -> None:
    """Every field of its declared type (``tfdp.run`` takes any Python value; the command line
    parsed them already): a bool is no integer here, and an integer is a float."""
    for field in dataclasses.fields(config):
        value, kind = getattr(config, field.name), field.type
        if typing.get_origin(kind) is typing.Union:  # Optional[X]
            if value is None:
                continue
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        accepted = (int, float) if kind is float else kind
        if not isinstance(value, accepted) or (kind is not bool and isinstance(value, bool)):
            raise UserError(f"--{field.name} must be {_NAMES[kind]}, got {value!r} "
                            f"({type(value).__name__})")


_NAMES = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}


def common(config) -> None:
    """The flags every path reads."""
    paths.get(config.strategy)  # Its own line when there is no such path.
    model_spec.check_spec(config.model)
    dataset_spec.check(config.dataset, config.image_size)
    if config.validation_split is not None and not 0 <= config.validation_split < 1:
        raise UserError(f"--validation_split must be from 0 to below 1 (the share of each "
                        f"class held out), got {config.validation_split}")
    for path in paths.all_paths():  # The choices a path declares for its own flags.
        for flag, own in path.own_flags.items():
            if own.choices:
                choice(flag, getattr(config, flag), own.choices)
    choice("precision", config.precision, PRECISIONS)
    if config.init is not None and config.init not in INITS and not (
            config.init.endswith(".npz") and os.path.isfile(config.init)):
        raise UserError(f"--init={config.init} is neither one of {', '.join(INITS)} nor an "
                        "existing .npz file of LeNet parameters")
    if config.init not in (None, "glorot") and config.model not in model_spec.LENETS:
        raise UserError(f"--init={config.init} starts LeNet; --model={config.model} starts "
                        "from its layers' own initializers (glorot), under --seed")
    if config.sync_batch_norm and config.model not in model_spec.OWN_BATCH_NORM:
        raise UserError(f"--sync_batch_norm synchronizes tfdp's own batch normalization "
                        f"({', '.join(model_spec.OWN_BATCH_NORM)}); --model={config.model} "
                        + ("has none" if not model_spec.is_own(config.model) else
                           "is yours: give its layers keras.layers.BatchNormalization("
                           "synchronized=True)"))
    for name in ("num_gpus", "epochs", "ps_shards", "num_ps"):
        positive(name, getattr(config, name))
    if config.batch_size is not None and config.per_replica_batch_size is not None:
        raise UserError("give --batch_size (global) or --per_replica_batch_size, not both")
    for name in ("batch_size", "per_replica_batch_size", "steps_per_epoch", "eval_steps",
                 "collective_timeout", "steps_per_execution", "bucket_kb"):
        if getattr(config, name) is not None:
            positive(name, getattr(config, name))
    if not (isinstance(config.lr, (int, float)) and math.isfinite(config.lr) and config.lr > 0):
        raise UserError(f"--lr must be a positive finite number, got {config.lr}")
    if config.target_accuracy is not None and not 0 < config.target_accuracy <= 1:
        raise UserError(f"--target_accuracy must be a fraction in (0, 1], got "
                        f"{config.target_accuracy}")
    if not 0 <= config.seed < 2 ** 32:  # What NumPy's and TensorFlow's generators take.
        raise UserError(f"--seed must be an integer from 0 to {2 ** 32 - 1}, got {config.seed}")
    if not (math.isfinite(config.warmup_epochs) and config.warmup_epochs >= 0):
        raise UserError(f"--warmup_epochs must be >= 0, got {config.warmup_epochs}")
    if config.manual_dir is not None and not os.path.isdir(config.manual_dir):
        raise UserError(f"--manual_dir={config.manual_dir} is not a folder: point it at the "
                        "folder holding the four Fashion-MNIST .gz files")
    try:
        parse_interval(config.backup_every)
    except ValueError:
        raise UserError(f"--backup_every={config.backup_every}: give steps (500), a time (90s, "
                        "10m, 2h) or 0 (only at epochs' ends and preemptions)") from None
    if config.trace_steps is not None:
        try:
            parse_steps(str(config.trace_steps))
        except ValueError:
            raise UserError(f"--trace_steps={config.trace_steps}: give A:B, the first and "
                            "last global step to trace (1 <= A <= B), or one step A") from None


def recipe(config) -> None:
    """The choices ``--recipe`` sets (each its own flag too)."""
    choice("schedule", config.schedule, ("constant", "one_cycle"))
    choice("augment", config.augment, ("none", "flip"))
    for name in ("momentum", "label_smoothing", "ema"):
        value = getattr(config, name)
        if not 0 <= value < 1:
            raise UserError(f"--{name} must be in [0, 1), got {value}")
    if not 0 < config.one_cycle_rise < 1:
        raise UserError(f"--one_cycle_rise must be in (0, 1), got {config.one_cycle_rise}")
    if config.nesterov and not config.momentum:
        raise UserError("--nesterov needs --momentum > 0 (Nesterov's is a kind of momentum)")
    if not (math.isfinite(config.weight_decay) and 0 <= config.weight_decay < 1):
        raise UserError(f"--weight_decay must be in [0, 1), got {config.weight_decay}")
    optimizer(config)


def optimizer(config) -> None:
    """``--optimizer`` and the hyperparameters it takes (``tfdp.models.optimizers``): one it
    does not take, set, is refused rather than ignored."""
    name = config.optimizer
    choice("optimizer", name, tuple(optimizers.OPTIMIZERS))
    for flag in optimizers.HYPERPARAMETERS:
        value = getattr(config, flag)
        if value not in (None, 0, False) and not optimizers.takes(name, flag):
            takes = [f"--{f}" for f in optimizers.HYPERPARAMETERS if optimizers.takes(name, f)]
            raise UserError(f"--{flag}={value} is not a setting of --optimizer={name}"
                            + (f", which takes {', '.join(takes)}" if takes else ""))
    for flag in ("beta_1", "beta_2", "rho"):
        value = getattr(config, flag)
        if value is not None and not 0 <= value < 1:
            raise UserError(f"--{flag} must be in [0, 1), got {value}")
    if config.epsilon is not None and not (math.isfinite(config.epsilon) and config.epsilon > 0):
        raise UserError(f"--epsilon must be a positive number, got {config.epsilon}")


def cadence(config) -> None:
    """--sync_every and --accumulate_steps (section 12.2)."""
    if config.sync_every is not None:
        positive("sync_every", config.sync_every)
    positive("accumulate_steps", config.accumulate_steps)
    if config.allreduce_dtype != "float32" and config.precision == "float64":
        raise UserError("--allreduce_dtype=bfloat16 with --precision=float64 would round "
                        "the gradients the float64 run exists to keep exact")


def the_path(config) -> None:
    """What ``--strategy``'s path takes (``tfdp.paths``): its models, no other path's
    flags, and its own refusals."""
    path = paths.get(config.strategy)
    model_on_path(config)
    paths.check_flags_owned(config)
    if path.check:
        path.check(config)


def model_on_path(config) -> None:
    """Refuse, in one line, a model this path does not train, naming the paths that do."""
    path = paths.get(config.strategy)
    if config.model in path.models or model_spec.is_own(config.model):
        return
    others = [p.name for p in paths.all_paths() if config.model in p.models]
    raise UserError(f"--model={config.model}: {path.models_note or 'not trained here'}; "
                    f"--strategy={path.name} trains {', '.join(path.models)}"
                    + (f": use --strategy={paths.either(others)}" if others else ""))
