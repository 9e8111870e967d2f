"""The run configuration: a frozen dataclass, validated once, with one-line errors.

Every field is a flag, its default and help written here once; every check a user can trip is
in ``tfdp.config.checks``, run when a ``Config`` is made, before any device, data or model work.
"""

import dataclasses
import os
from typing import Optional

from tfdp import paths
from tfdp.config import checks, model_spec, recipes
from tfdp.config import optimizer_spec as optimizers
from tfdp.config.checks import parse_steps
from tfdp.export import formats
from tfdp.util.errors import UserError

# Short names accepted for --precision (the issue tracker and other libraries use them).
PRECISION_ALIASES = {"fp32": "float32", "fp64": "float64", "bf16": "bfloat16"}
DEFAULT_BATCH_SIZE = recipes.RECIPES["textbook"]["batch_size"]
# Set by the launcher: for all its workers, so they share one default run folder; for its
# chief, when the launcher runs in a terminal, so that the chief draws its progress bar.
RUN_STAMP_ENV = "TFDP_RUN_STAMP"
LIVE_PROGRESS_ENV = "TFDP_LIVE_PROGRESS"
# In the workers' environment of a launcher whose group goes on when a worker is lost (its
# flags, ``--num_workers=MIN:MAX`` or ``--max_restarts``): the launcher re-forms the group.
GROUP_GOES_ON_ENV = "TFDP_GROUP_GOES_ON"
# In the workers' environment of a group the launcher re-formed after a loss or a join: when it
# saw it (Unix seconds) and what it was, so that the chief says how soon the group trains again.
REGROUPED_ENV = "TFDP_REGROUPED"
# The default of --plots for every run started where it is set: a sweep's or a CI job's.
PLOTS_ENV = "TFDP_PLOTS"


def _flag(default, help_text):
    """A field that is also a flag of ``tfdp.train`` (and a keyword of ``tfdp.run``); its help
    a text, or a function that writes it when asked (``help_of``)."""
    return dataclasses.field(default=default, metadata={"help": help_text})


def help_of(field: dataclasses.Field) -> str:
    """A flag's help, as of now: ``--strategy``'s lists the paths registered."""
    text = field.metadata["help"]
    return text() if callable(text) else text


@dataclasses.dataclass(frozen=True)
class Config:
    """What one training run needs. Each field is a flag: its default and help are written here
    only (``tfdp.config.flags`` defines the command line from them)."""

    strategy: str = _flag("manual", paths.help_text)
    recipe: str = _flag(
        "textbook", "A named set of the choices below, each of which a flag given explicitly "
        "overrides: textbook (the chapter's: lenet, plain SGD at a constant rate, batch 256) "
        "or fast (the time-to-accuracy recipe: lenet_bn, Nesterov momentum, a one-cycle rate "
        "up to 0.5 over 2 epochs, label smoothing, flips, weight averaging, batch 128; "
        "docs/time-to-accuracy.md).")
    model: Optional[str] = _flag(
        None, "lenet (the textbook's LeNet), lenet_bn (LeNet with batch normalization after "
        "each convolution and the hidden dense layer), resnet18 (its ResNet-18 variant), or "
        "your own Keras model: package.module:function or path/to/file.py:function, a "
        "function(input_shape, num_classes) returning it (docs/your-model.md). Default: the "
        "recipe's.")
    dataset: str = _flag(
        "fashion_mnist", "The images to train on: a TFDS image-classification dataset by name "
        "(fashion_mnist, mnist, cifar10, ...; prepared in --data_dir), folder:ROOT (images in "
        "ROOT/<class>/, or in ROOT/train/<class>/ and ROOT/test/<class>/; PNG or JPEG), or "
        "npz:FILE (x_train, y_train, x_test, y_test, as Keras' mnist.npz); tfdp.run also "
        "takes the arrays themselves. Shape, channels and classes come from the data "
        "(docs/your-data.md).")
    image_size: Optional[str] = _flag(
        None, "HxW (or one side) to fit every image to, keeping its aspect ratio (the rest "
        "padded with black): images of different sizes are fitted to the most common size "
        "(a tie: the larger) unless this is given.")
    validation_split: Optional[float] = _flag(
        None, "The share of each class's training images held out, drawn by --seed, to "
        "evaluate on after every epoch (the lines, --target_accuracy); the test set is then "
        "evaluated once, at the end. Default: 0, or 0.2 for a dataset without a test set "
        "(folder:ROOT as ROOT/<class>/*).")
    num_gpus: int = _flag(
        1, "Devices to train on (per worker under multi_worker and across machines). With fewer "
        "GPUs than this, the devices that exist are split into logical devices (logical CPUs on a "
        "CPU machine).")
    batch_size: Optional[int] = _flag(
        None, "Global minibatch, split across all replicas (default: the recipe's, textbook "
        f"{DEFAULT_BATCH_SIZE}).")
    per_replica_batch_size: Optional[int] = _flag(
        None, "Minibatch per replica instead of --batch_size: global = this x replicas.")
    optimizer: Optional[str] = _flag(None, optimizers.help_text)
    lr: Optional[float] = _flag(
        None, "Learning rate (for the global batch as given; the peak of a one-cycle "
        "schedule). Default: the recipe's for its optimizer (textbook: sgd at 0.2), else "
        "Keras' (0.001).")
    momentum: Optional[float] = _flag(
        None, "sgd and rmsprop: momentum in [0, 1), Keras' formula (0: none). Default: the "
        "recipe's for sgd, else 0.")
    nesterov: Optional[bool] = _flag(
        None, "sgd: Nesterov momentum (needs --momentum > 0). Default: the recipe's.")
    beta_1: Optional[float] = _flag(
        None, "adam, adamw, lion: the first moment's decay rate (Keras' default 0.9).")
    beta_2: Optional[float] = _flag(
        None, "adam, adamw: the second moment's decay rate (Keras' 0.999); lion: the "
        "momentum's (Keras' 0.99).")
    rho: Optional[float] = _flag(
        None, "rmsprop: the squared gradients' decay rate (Keras' default 0.9).")
    epsilon: Optional[float] = _flag(
        None, "adam, adamw, rmsprop: the small constant added for numerical stability "
        "(Keras' default 1e-7).")
    weight_decay: Optional[float] = _flag(
        None, "Decoupled weight decay, Keras' formula: each step every trainable variable "
        "shrinks by lr x this. Default: the recipe's for its optimizer (textbook 0), else "
        "Keras' (adamw 0.004, the others 0).")
    schedule: Optional[str] = _flag(
        None, "constant (the --scale_lr warmup, if any, then --lr) or one_cycle (from lr/10 "
        "up to --lr over the first --one_cycle_rise of the run's steps, then down to 0 at its "
        "last step; the run's length is --epochs). Default: the recipe's.")
    one_cycle_rise: Optional[float] = _flag(
        None, "The share of the run's steps over which one_cycle's rate rises to --lr, in (0, "
        "1). Default: the recipe's (fast 0.15, textbook 0.25).")
    label_smoothing: Optional[float] = _flag(
        None, "Label smoothing in [0, 1): the training loss's target puts this much of its "
        "mass evenly on all classes. Default: the recipe's.")
    augment: Optional[str] = _flag(
        None, "none or flip (each training image flipped left-right with probability 1/2, "
        "decided by --seed, the epoch and the example, so every path and device count sees "
        "the same images). Default: the recipe's.")
    eval_flip: Optional[bool] = _flag(
        None, "Evaluate, and serve, the mean of the logits of each image and its left-right "
        "mirror image (test-time augmentation; the export holds it). Default: the recipe's.")
    ema: Optional[float] = _flag(
        None, "Weight averaging: evaluate and export an exponential moving average of the "
        "trained weights, moved after every step with this momentum (Keras' use_ema and "
        "ema_momentum: batch normalization's running statistics are not averaged); 0: off. "
        "Default: the recipe's.")
    scale_lr: bool = _flag(
        False, "Linear scaling rule (Goyal et al. 2017): lr x replicas, reached after a linear "
        "warmup.")
    warmup_epochs: float = _flag(
        1.0, "Length of the --scale_lr warmup in epochs (fractions allowed; 0 for none).")
    epochs: Optional[int] = _flag(
        None, "Training epochs (a one-cycle schedule spans them). Default: the recipe's "
        "(textbook 10, fast 2).")
    target_accuracy: Optional[float] = _flag(
        None, "Stop at the first evaluation whose test accuracy reaches this (0 to 1), export "
        "that model, and say how long it took, timed as MLPerf times it: loading the data, "
        "compiling and every evaluation count (each epoch's record holds the clock, clock_s).")
    seed: int = _flag(0, "Seed for initial weights and the shuffling order.")
    init: Optional[str] = _flag(
        None, "Starting weights: textbook (normal x 0.01; the loss sits at ln 10 for about an "
        "epoch), glorot (Glorot-uniform, Keras' default; learns at once), or a .npz file of "
        "LeNet parameters W1..b4. Default: the path's (textbook for manual and "
        "parameter_server, glorot for the Keras strategies).")
    steps_per_epoch: Optional[int] = _flag(
        None, "Cap on training steps per epoch, for short runs (default: whole epoch).")
    eval_steps: Optional[int] = _flag(
        None, "Cap on evaluation batches, for short runs (default: whole test set).")
    allreduce: str = _flag("add_n", paths.own_help("allreduce"))
    allreduce_dtype: str = _flag("float32", paths.own_help("allreduce_dtype"))
    bucket_kb: Optional[int] = _flag(None, paths.own_help("bucket_kb"))
    overlap: str = _flag("auto", paths.own_help("overlap"))
    ps_shards: int = _flag(1, paths.own_help("ps_shards"))
    precision: Optional[str] = _flag(
        None, "float32; bfloat16 (or bf16): mixed precision, computing in bfloat16 with "
        "float32 parameters, update, loss and softmax (fast on CPUs with avx512_bf16 or AMX "
        "and on recent GPUs); float64: every variable and computation in double precision, "
        "slower, for checking that paths and device counts train the same model to rounding; "
        "or auto: bfloat16 where this machine's measured bfloat16 speed makes it pay, float32 "
        "elsewhere (each process decides for its own machine). Default: the recipe's "
        "(textbook: float32, fast: auto).")
    steps_per_execution: int = _flag(1, paths.own_help("steps_per_execution"))
    sync_every: Optional[int] = _flag(None, paths.own_help("sync_every"))
    accumulate_steps: int = _flag(
        1, "Gradient accumulation: each update sums the gradients of this many micro-batches "
        "of --batch_size, locally on each replica, and allreduces once. The update's global "
        "batch is K x --batch_size; steps, epochs, lr scaling and warmup count updates. "
        "Batch normalization's statistics are per micro-batch.")
    trace_steps: Optional[str] = _flag(
        None, "Record global steps A:B (counted from 1; A alone for one step) with TensorFlow's "
        "profiler, one step per call: the profile (TensorBoard's profile tab), timeline.json "
        "(Perfetto, chrome://tracing: a lane per replica, worker and host, every event "
        "classed) and timeline.png in the run folder (docs/section-12.3.md).")
    synthetic_data: bool = _flag(
        False, "Random images of the real shapes, made in memory: takes the input pipeline out "
        "of benchmarks (accuracy is then meaningless).")
    eager: bool = _flag(False,
                        "Run the training step eagerly instead of compiled (slow; for teaching).")
    jit_compile: bool = _flag(
        False, "Compile each replica's forward and backward pass with XLA (the from-scratch "
        "paths) or Keras' step (fit's jit_compile) instead of TensorFlow's kernels alone; on CPU "
        "it was slower on every path (docs/time-to-accuracy.md#xla).")
    sync_batch_norm: bool = _flag(
        False, "resnet18: batch-norm statistics over the global batch, across replicas.")
    data_dir: Optional[str] = _flag(None,
                                    "tensorflow-datasets data dir (default: TFDS's own).")
    manual_dir: Optional[str] = _flag(
        None, "Folder with the four Fashion-MNIST .gz files, used instead of a download when the "
        "data is not yet prepared (default: $TFDP_MANUAL_DIR, else ../shared/data/fashion_mnist "
        "beside this checkout, if either exists).")
    export_dir: Optional[str] = _flag(
        None, "SavedModel root; each run adds a version <export_dir>/<n> "
        "(default: saved_models/<model>).")
    export_formats: str = _flag(
        "saved_model", "What each export version holds, comma-separated: saved_model (always), "
        "onnx (model.onnx, through tf2onnx: pip install 'tfdp[onnx]'), litert (model.tflite, "
        "a LiteRT flatbuffer: pip install 'tfdp[litert]'); one serving contract in all "
        "(docs/serving.md).")
    workdir: Optional[str] = _flag(
        None, "Logs, metrics.json, accuracy.png, TensorBoard and backups (default: a new folder "
        "per run, runs/<strategy>-<model>-<n>dev-<date>-<time>; give a run's folder to resume "
        "it).")
    backup_every: str = _flag(
        "10m", "Back up within an epoch too, every N steps (500) or every so long (90s, 10m, "
        "2h): a hard stop (SIGKILL, out of memory, a node lost) loses at most that much "
        "training; 0: only at each epoch's end and at a preemption. Written behind training "
        "(docs/faults.md).")
    collective_timeout: int = _flag(
        300, "multi_worker, parameter_server, and manual across machines: seconds start-up, "
        "and then each collective or step, waits for the peers before failing.")
    num_ps: int = _flag(
        1, "parameter_server under a cluster manager (Slurm's srun, a Kubernetes Indexed Job), "
        "where tfdp builds TF_CONFIG itself: how many of the last tasks are parameter servers.")
    verbose: bool = _flag(
        False, "Also print TensorFlow's, TFDS' and absl's INFO lines and progress bars (hidden "
        "by default: tfdp prints its own lines, warnings and errors).")
    plots: Optional[bool] = _flag(
        None, "Draw accuracy.png, confusion.png and mistakes.png in --workdir, and their images "
        "in TensorBoard. false leaves the drawing out, for sweeps and many short runs, where it "
        "is a sizeable part of a run's CPU time: metrics.json and TensorBoard's scalars keep "
        f"every number, the confusion matrix and the mistakes included. Default: ${PLOTS_ENV} "
        "where it is set (0 or 1), else true.")

    def __post_init__(self):
        # Frozen: the full names of aliased values are set once, here, before the checks.
        for name in ("precision", "allreduce_dtype"):
            if getattr(self, name) in PRECISION_ALIASES:
                object.__setattr__(self, name, PRECISION_ALIASES[getattr(self, name)])
        checks.choice("recipe", self.recipe, tuple(recipes.RECIPES))
        if self.optimizer is not None:
            checks.choice("optimizer", self.optimizer, tuple(optimizers.OPTIMIZERS))
        for name, value in recipes.choices(self.recipe, self.strategy,
                                           self.optimizer).items():
            if getattr(self, name) is None and not (
                    name == "batch_size" and self.per_replica_batch_size is not None):
                object.__setattr__(self, name, value)
        checks.check(self)
        object.__setattr__(self, "export_formats",
                           ",".join(formats.parse(self.export_formats)))

    @property
    def traced_steps(self) -> Optional[tuple]:
        """``--trace_steps`` as (first, last), or None."""
        return parse_steps(str(self.trace_steps)) if self.trace_steps is not None else None

    @property
    def steps_between_syncs(self) -> int:
        """``--sync_every`` as resolved: the path's default (the manual path's own), else 1."""
        if self.sync_every is not None:
            return self.sync_every
        return paths.get(self.strategy).defaults.get("sync_every", 1)

    @property
    def initializer(self) -> str:
        """``--init`` as resolved: the path's default (the textbook's start for the
        from-scratch paths), else Keras' own (Glorot)."""
        return self.init or paths.get(self.strategy).defaults.get("init", "glorot")

    @property
    def variable_dtype(self) -> str:
        """The parameters' dtype: float32 under bfloat16 mixed precision."""
        return "float32" if self.precision == "bfloat16" else self.precision

    @property
    def export_root(self) -> str:
        return self.export_dir or os.path.join("saved_models", model_spec.name_of(self.model))

    def default_run_dir(self, stamp: str) -> str:
        """The run folder when ``--workdir`` gives none, stamped ``stamp`` (the start's time,
        or the stamp every worker of a launched or managed cluster shares)."""
        model = model_spec.name_of(self.model)
        return os.path.join("runs", f"{self.strategy}-{model}-{self.num_gpus}dev-{stamp}")

    def plots_or_default(self) -> bool:
        """``--plots`` as given, else ``$TFDP_PLOTS`` (0 or 1) where it is set, else true."""
        if self.plots is not None:
            return self.plots
        value = os.environ.get(PLOTS_ENV, "").strip().lower()
        if value not in ("", "0", "1", "false", "true"):
            raise UserError(f"{PLOTS_ENV}={value}: give 0 or 1 (the default of --plots)")
        return value not in ("0", "false")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
