"""Every command-line flag of ``tfdp.train``, defined in one function.

This is the only module that reads ``absl.flags.FLAGS``: ``config_from_flags`` turns the parsed
flags into a frozen :class:`tfdp.config.Config`, and nothing below ``train.py`` sees a flag.
The launcher and the benchmark forward these same flags to ``tfdp.train`` unchanged.
"""

from absl import flags

from tfdp.config import Config

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Define the training flags (idempotent, so tests and the bench may call it again)."""
    if "strategy" in FLAGS:
        return
    flags.DEFINE_string(
        "strategy", "manual",
        "manual: the from-scratch data-parallel loop; mirrored: Keras fit under "
        "MirroredStrategy; multi_worker: Keras fit under MultiWorkerMirroredStrategy (TF_CONFIG); "
        "plain: Keras fit on one device with no tf.distribute strategy (the baseline).")
    flags.DEFINE_string("model", "lenet", "lenet or resnet18 (resnet18 needs a Keras strategy).")
    flags.DEFINE_integer(
        "num_gpus", 1,
        "Devices to train on (per worker under multi_worker). With fewer GPUs than this, the "
        "devices that exist are split into logical devices (logical CPUs on a CPU machine).")
    flags.DEFINE_integer("batch_size", None,
                         "Global minibatch, split across all replicas (default 256).")
    flags.DEFINE_integer("per_replica_batch_size", None,
                         "Minibatch per replica instead of --batch_size: global = this x replicas.")
    flags.DEFINE_float("lr", 0.2, "SGD learning rate (for the global batch as given).")
    flags.DEFINE_boolean(
        "scale_lr", False,
        "Linear scaling rule (Goyal et al. 2017): lr x replicas, reached after a linear warmup.")
    flags.DEFINE_float("warmup_epochs", 1.0,
                       "Length of the --scale_lr warmup in epochs (fractions allowed; 0 for none).")
    flags.DEFINE_integer("epochs", 10, "Training epochs.")
    flags.DEFINE_integer("seed", 0, "Seed for initial weights and the shuffling order.")
    flags.DEFINE_string(
        "init", None,
        "Starting weights: textbook (normal x 0.01; the loss sits at ln 10 for about an epoch), "
        "glorot (Glorot-uniform, Keras' default; learns at once), or a .npz file of LeNet "
        "parameters W1..b4. Default: textbook for manual, glorot for the Keras strategies.")
    flags.DEFINE_integer("steps_per_epoch", None,
                         "Cap on training steps per epoch, for short runs (default: whole epoch).")
    flags.DEFINE_integer("eval_steps", None,
                         "Cap on evaluation batches, for short runs (default: whole test set).")
    flags.DEFINE_string("allreduce", "add_n",
                        "manual path: add_n (textbook), sharded (parameter-server style) or ring.")
    flags.DEFINE_string(
        "precision", "float32",
        "float32, or float64: every variable and computation in double precision, slower, for "
        "checking that paths and device counts train the same model to rounding (1e-9).")
    flags.DEFINE_boolean("eager", False,
                         "Run the training step eagerly instead of compiled (slow; for teaching).")
    flags.DEFINE_integer("steps_per_execution", 1,
                         "Keras paths: training steps per compiled call (fewer Python round "
                         "trips; progress and callbacks then update every N steps).")
    flags.DEFINE_boolean("synthetic_data", False,
                         "Random images of the real shapes, made in memory: takes the input "
                         "pipeline out of benchmarks (accuracy is then meaningless).")
    flags.DEFINE_boolean("sync_batch_norm", False,
                         "resnet18: batch-norm statistics over the global batch, across replicas.")
    flags.DEFINE_string("data_dir", None, "tensorflow-datasets data dir (default: TFDS's own).")
    flags.DEFINE_string(
        "manual_dir", None,
        "Folder with the four Fashion-MNIST .gz files, used instead of a download when the data "
        "is not yet prepared (default: $TFDP_MANUAL_DIR, else ../shared/data/fashion_mnist "
        "beside this checkout, if either exists).")
    flags.DEFINE_string("export_dir", None,
                        "SavedModel root; each run adds a version <export_dir>/<n> "
                        "(default: saved_models/<model>).")
    flags.DEFINE_string("workdir", None,
                        "Logs, metrics.json, accuracy.png, TensorBoard and backups "
                        "(default: a new folder per run, runs/<strategy>-<model>-<n>dev-<date>-"
                        "<time>; give a run's folder to resume it).")
    flags.DEFINE_integer("collective_timeout", 300,
                         "multi_worker: seconds a collective waits for its peers before failing.")
    flags.DEFINE_boolean("verbose", False,
                         "Also print TensorFlow's, TFDS' and absl's INFO lines and progress bars "
                         "(hidden by default: tfdp prints its own lines, warnings and errors).")


def config_from_flags() -> Config:
    """Build the validated run configuration from the parsed flags."""
    return Config(
        strategy=FLAGS.strategy,
        model=FLAGS.model,
        num_gpus=FLAGS.num_gpus,
        batch_size=FLAGS.batch_size,
        per_replica_batch_size=FLAGS.per_replica_batch_size,
        lr=FLAGS.lr,
        scale_lr=FLAGS.scale_lr,
        warmup_epochs=FLAGS.warmup_epochs,
        epochs=FLAGS.epochs,
        seed=FLAGS.seed,
        init=FLAGS.init,
        steps_per_epoch=FLAGS.steps_per_epoch,
        eval_steps=FLAGS.eval_steps,
        allreduce=FLAGS.allreduce,
        precision=FLAGS.precision,
        steps_per_execution=FLAGS.steps_per_execution,
        synthetic_data=FLAGS.synthetic_data,
        eager=FLAGS.eager,
        sync_batch_norm=FLAGS.sync_batch_norm,
        data_dir=FLAGS.data_dir,
        manual_dir=FLAGS.manual_dir,
        export_dir=FLAGS.export_dir,
        workdir=FLAGS.workdir,
        collective_timeout=FLAGS.collective_timeout,
        verbose=FLAGS.verbose,
    )
