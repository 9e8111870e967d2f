"""Every check of ``tfdp.config.Config``, each written once: the flags every run has, then each
path's own (``from_scratch``, ``keras_fit``, ``parameter_server``), then the cadence flags of
section 12.2. ``check(config)`` runs them all in that order, before any device, data or model
work, and each refusal is one line naming the flag to change.
"""

import dataclasses
import math
import os
import typing

from tfdp.errors import UserError

STRATEGIES = ("manual", "mirrored", "multi_worker", "plain", "parameter_server")
MODELS = ("lenet", "lenet_bn", "resnet18")
FROM_SCRATCH_MODELS = ("lenet", "lenet_bn")  # The from-scratch step's own LeNets.
ALLREDUCES = ("add_n", "sharded", "ring")
INITS = ("textbook", "glorot")
PRECISIONS = ("float32", "float64", "bfloat16", "auto")
KERAS_FIT = ("mirrored", "multi_worker", "plain")

NO_SYNC_EVERY = {
    "plain": "Keras fit's own is --steps_per_execution",
    # See the --steps_per_execution refusal in keras_fit.
    "mirrored": "under tf.distribute Keras' multi-step loop (--steps_per_execution) fails",
    "multi_worker": "under tf.distribute Keras' multi-step loop (--steps_per_execution) fails",
    "parameter_server": "the coordinator already runs up to two steps per worker ahead and "
                        "reads each step's result as it arrives",
}


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


def check(config) -> None:
    """All of a configuration's checks (its aliases already resolved)."""
    types(config)
    common(config)
    recipe(config)
    from_scratch(config)
    keras_fit(config)
    parameter_server(config)
    cadence(config)


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
    choice("strategy", config.strategy, STRATEGIES)
    choice("model", config.model, MODELS)
    choice("allreduce", config.allreduce, ALLREDUCES)
    choice("allreduce_dtype", config.allreduce_dtype, ("float32", "bfloat16"))
    choice("precision", config.precision, PRECISIONS)
    choice("overlap", config.overlap, ("auto", "none"))
    if config.init is not None and config.init not in INITS and not (
            config.init.endswith(".npz") and os.path.isfile(config.init)):
        raise UserError(f"--init={config.init} is neither one of {', '.join(INITS)} nor an "
                        "existing .npz file of LeNet parameters")
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
    if config.nesterov and not config.momentum:
        raise UserError("--nesterov needs --momentum > 0 (Nesterov's is a kind of momentum)")
    if not (math.isfinite(config.weight_decay) and 0 <= config.weight_decay < 1):
        raise UserError(f"--weight_decay must be in [0, 1), got {config.weight_decay}")


def from_scratch(config) -> None:
    """--strategy=manual, and the flags of its own allreduce that no other path has."""
    if config.strategy == "manual":
        if config.model not in FROM_SCRATCH_MODELS:
            raise UserError(f"--model={config.model} needs --strategy=mirrored, multi_worker, "
                            "plain or parameter_server: the from-scratch path (--strategy="
                            "manual) trains lenet and lenet_bn")
        if config.sync_batch_norm:
            raise UserError("--sync_batch_norm is the Keras paths': the from-scratch lenet_bn "
                            "normalizes each replica's shard and keeps one set of running "
                            "statistics, their mean")
        if config.steps_per_execution > 1:
            raise UserError("--steps_per_execution is a Keras option: the manual path runs "
                            "one compiled step per call")
        if config.model == "lenet_bn" and config.accumulate_steps > 1:
            raise UserError(f"--accumulate_steps={config.accumulate_steps} with lenet_bn: the "
                            "from-scratch step moves batch normalization's statistics once an "
                            "update; use --batch_size instead, or a Keras strategy")
    elif config.allreduce_dtype != "float32":
        raise UserError(f"--allreduce_dtype={config.allreduce_dtype} is the manual path's "
                        f"(its own allreduce); --strategy={config.strategy} sums in float32")
    elif config.bucket_kb is not None or config.overlap != "auto":
        raise UserError(f"--bucket_kb and --overlap are the manual path's (its own "
                        f"allreduce); --strategy={config.strategy} exchanges gradients in "
                        "TensorFlow's collectives")
    if config.allreduce_dtype != "float32" and config.precision == "float64":
        raise UserError("--allreduce_dtype=bfloat16 with --precision=float64 would round "
                        "the gradients the float64 run exists to keep exact")


def keras_fit(config) -> None:
    """Keras ``fit``: plain (no strategy), mirrored and multi_worker."""
    if config.strategy == "plain" and config.num_gpus != 1:
        raise UserError(f"--strategy=plain trains on one device without tf.distribute; for "
                        f"--num_gpus={config.num_gpus} use --strategy=mirrored")
    if config.steps_per_execution > 1 and config.strategy in ("mirrored", "multi_worker"):
        # Keras 3.15's multi-step loop (multi_step_on_iterator in its backend/tensorflow/
        # trainer.py) calls get_next_as_optional() on the distributed iterator inside a
        # tf.cond inside its tf.while_loop; TF 2.21 then leaves a placeholder of that cond
        # unfed: "You must feed a value for placeholder tensor 'while/body/_1/while/cond/
        # then/_171/while/cond/Placeholder'" (docs/section-12.2.md).
        raise UserError(f"--steps_per_execution={config.steps_per_execution} works with "
                        "--strategy=plain only: Keras fails with it under tf.distribute")


def parameter_server(config) -> None:
    """--ps_shards, and what --strategy=parameter_server cannot do."""
    if config.strategy != "parameter_server":
        if config.ps_shards != 1:
            raise UserError(f"--ps_shards={config.ps_shards} is --strategy=parameter_server's "
                            f"(--strategy={config.strategy} keeps no parameter servers)")
        return
    if config.model == "lenet_bn":
        raise UserError("--model=lenet_bn: the parameter servers' from-scratch store holds "
                        "parameters only, not batch normalization's running statistics; use "
                        "lenet or resnet18")
    if config.ema:
        raise UserError(f"--ema={config.ema}: the parameter servers' workers each apply their "
                        "own gradients, and no one step moves an average; use --ema=0")
    if config.momentum or config.nesterov:
        raise UserError(f"--momentum={config.momentum}: asynchronous SGD applies each "
                        "worker's gradients to parameters other workers moved since it read "
                        "them, and momentum would carry those stale steps on; use --momentum=0")
    if config.model != "lenet" and config.ps_shards > 1:
        raise UserError(f"--ps_shards={config.ps_shards} splits the from-scratch lenet's "
                        f"parameters; --model={config.model}'s Keras layers read whole "
                        "variables: use --ps_shards=1 (its variables are spread round robin)")
    if config.num_gpus != 1:
        raise UserError(f"--num_gpus={config.num_gpus}: under --strategy=parameter_server "
                        "each worker trains on one device; add workers (tfdp.launch "
                        "--num_workers) instead")
    if config.eager:
        raise UserError("--eager: the coordinator of --strategy=parameter_server schedules "
                        "compiled steps only")
    if config.steps_per_execution > 1:
        raise UserError("--steps_per_execution is a Keras option: the parameter-server "
                        "path schedules one compiled step at a time")


def cadence(config) -> None:
    """--sync_every and --accumulate_steps against the path (section 12.2)."""
    if config.sync_every is not None:
        positive("sync_every", config.sync_every)
        if config.sync_every > 1 and config.strategy != "manual":
            raise UserError(f"--sync_every={config.sync_every} is the manual path's: "
                            + NO_SYNC_EVERY[config.strategy])
    positive("accumulate_steps", config.accumulate_steps)
    if config.accumulate_steps > 1 and config.strategy == "parameter_server":
        raise UserError(f"--accumulate_steps={config.accumulate_steps} saves the allreduces "
                        "of synchronous training; parameter servers take each worker's "
                        "gradients as they come, and accumulating them on a worker would "
                        "only make its updates staler: raise --batch_size instead")
