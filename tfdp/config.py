"""The run configuration: a frozen dataclass, validated once, with one-line errors.

Every check a user can trip lives here, so it runs before any device, data or model work and
names the flag to change.
"""

import dataclasses
import json
import math
import os
import time
from typing import Optional

from tfdp.errors import UserError

STRATEGIES = ("manual", "mirrored", "multi_worker", "plain")
MODELS = ("lenet", "resnet18")
ALLREDUCES = ("add_n", "sharded", "ring")
INITS = ("textbook", "glorot")
PRECISIONS = ("float32", "float64")
DEFAULT_BATCH_SIZE = 256
# Set by the launcher: for all its workers, so they share one default run folder; for its
# chief, when the launcher runs in a terminal, so that the chief draws its progress bar.
RUN_STAMP_ENV = "TFDP_RUN_STAMP"
LIVE_PROGRESS_ENV = "TFDP_LIVE_PROGRESS"


@dataclasses.dataclass(frozen=True)
class Config:
    """What one training run needs; field names are the flag names."""

    strategy: str = "manual"
    model: str = "lenet"
    num_gpus: int = 1
    batch_size: Optional[int] = None
    per_replica_batch_size: Optional[int] = None
    lr: float = 0.2
    scale_lr: bool = False
    warmup_epochs: float = 1.0
    epochs: int = 10
    seed: int = 0
    init: Optional[str] = None
    steps_per_epoch: Optional[int] = None
    eval_steps: Optional[int] = None
    allreduce: str = "add_n"
    precision: str = "float32"
    steps_per_execution: int = 1
    synthetic_data: bool = False
    eager: bool = False
    sync_batch_norm: bool = False
    data_dir: Optional[str] = None
    manual_dir: Optional[str] = None
    export_dir: Optional[str] = None
    workdir: Optional[str] = None
    collective_timeout: int = 300
    verbose: bool = False

    def __post_init__(self):
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("model", self.model, MODELS)
        _choice("allreduce", self.allreduce, ALLREDUCES)
        _choice("precision", self.precision, PRECISIONS)
        if self.init is not None and self.init not in INITS and not (
                self.init.endswith(".npz") and os.path.isfile(self.init)):
            raise UserError(f"--init={self.init} is neither one of {', '.join(INITS)} nor an "
                            "existing .npz file of LeNet parameters")
        if self.strategy == "manual" and self.model != "lenet":
            raise UserError(f"--model={self.model} needs --strategy=mirrored or multi_worker: "
                            "the from-scratch path (--strategy=manual) trains lenet only")
        _positive("num_gpus", self.num_gpus)
        if self.strategy == "plain" and self.num_gpus != 1:
            raise UserError(f"--strategy=plain trains on one device without tf.distribute; for "
                            f"--num_gpus={self.num_gpus} use --strategy=mirrored")
        _positive("epochs", self.epochs)
        if self.steps_per_execution > 1 and self.strategy in ("mirrored", "multi_worker"):
            # Keras 3.15's multi-step loop over a distributed iterator fails in graph execution
            # ("You must feed a value for placeholder ... while/cond"), seen with TF 2.21.
            raise UserError(f"--steps_per_execution={self.steps_per_execution} works with "
                            "--strategy=plain only: Keras fails with it under tf.distribute")
        if self.strategy == "manual" and self.steps_per_execution > 1:
            raise UserError("--steps_per_execution is a Keras option: the manual path runs "
                            "one compiled step per call")
        if self.batch_size is not None and self.per_replica_batch_size is not None:
            raise UserError("give --batch_size (global) or --per_replica_batch_size, not both")
        for name in ("batch_size", "per_replica_batch_size", "steps_per_epoch", "eval_steps",
                     "collective_timeout", "steps_per_execution"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"--lr must be a positive finite number, got {self.lr}")
        if not (math.isfinite(self.warmup_epochs) and self.warmup_epochs >= 0):
            raise UserError(f"--warmup_epochs must be >= 0, got {self.warmup_epochs}")
        if self.manual_dir is not None and not os.path.isdir(self.manual_dir):
            raise UserError(f"--manual_dir={self.manual_dir} is not a folder: point it at the "
                            "folder holding the four Fashion-MNIST .gz files")

    @property
    def initializer(self) -> str:
        """The textbook's start for the from-scratch path, Keras' own (Glorot) for fit."""
        return self.init or ("textbook" if self.strategy == "manual" else "glorot")

    @property
    def export_root(self) -> str:
        return self.export_dir or os.path.join("saved_models", self.model)

    @property
    def run_dir(self) -> str:
        if self.workdir is None:
            raise ValueError("call with_run_dir() first: the default run folder is chosen once")
        return self.workdir

    def global_batch_size(self, replicas: int) -> int:
        """The global batch for ``replicas`` replicas; refuses one too small to split."""
        if self.per_replica_batch_size is not None:
            return self.per_replica_batch_size * replicas
        batch = self.batch_size or DEFAULT_BATCH_SIZE
        if batch < replicas:
            raise UserError(f"--batch_size={batch} is smaller than the {replicas} replicas it is "
                            f"split across: use --batch_size >= {replicas}")
        return batch

    def peak_lr(self, replicas: int) -> float:
        """The learning rate after warmup: scaled by the replicas with --scale_lr."""
        return self.lr * replicas if self.scale_lr else self.lr

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def with_run_dir(config: Config) -> Config:
    """``config`` with ``workdir`` set: a new folder per run by default,
    ``runs/<strategy>-<model>-<n>dev-<date>-<time>``, so runs never overwrite each other and
    ``tensorboard --logdir runs`` compares them. To resume a run, pass its folder as
    ``--workdir``."""
    if config.workdir is not None:
        return config
    stamp = os.environ.get(RUN_STAMP_ENV)
    if stamp is None and config.strategy == "multi_worker" and _workers_in_tf_config() > 1:
        raise UserError("--strategy=multi_worker with several workers needs --workdir: every "
                        "worker must use the same run folder (tfdp.launch chooses one for you)")
    base = os.path.join("runs", f"{config.strategy}-{config.model}-{config.num_gpus}dev-"
                                f"{stamp or time.strftime('%Y%m%d-%H%M%S')}")
    path, n = base, 1
    while stamp is None and os.path.exists(path):  # Two runs started in the same second.
        n += 1
        path = f"{base}-{n}"
    return dataclasses.replace(config, workdir=path)


def _workers_in_tf_config() -> int:
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
        return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))
    except (ValueError, AttributeError):
        return 0  # Reported by the strategy, with the fix.


def _choice(flag, value, choices):
    if value not in choices:
        raise UserError(f"--{flag}={value} is not one of: {', '.join(choices)}")


def _positive(flag, value):
    if not isinstance(value, int) or value <= 0:
        raise UserError(f"--{flag} must be a positive integer, got {value}")
