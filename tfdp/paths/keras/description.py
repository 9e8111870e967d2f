"""Keras ``fit`` as the registry knows it (``tfdp.paths``), without TensorFlow:
``--strategy=plain`` (no tf.distribute), ``mirrored`` and ``multi_worker``."""

from tfdp.paths import (KERAS_DEFAULT, MIRRORED, MULTI_WORKER_MIRRORED, NO_CLUSTER, WORKERS,
                        OwnFlag, Path, register)
from tfdp.util.errors import UserError

TRAINER = "tfdp.paths.keras.trainer:KerasFitPath"
# Keras 3.15's multi-step loop (multi_step_on_iterator in its backend/tensorflow/trainer.py)
# calls get_next_as_optional() on the distributed iterator inside a tf.cond inside its
# tf.while_loop; TF 2.21 then leaves a placeholder of that cond unfed: "You must feed a value
# for placeholder tensor 'while/body/_1/while/cond/then/_171/while/cond/Placeholder'"
# (docs/section-12.2.md).
UNDER_DISTRIBUTE = {
    "steps_per_execution": "Keras fails with it under tf.distribute",
    "sync_every": "under tf.distribute Keras' multi-step loop (--steps_per_execution) fails",
}


# Under tf.distribute (mirrored; multi_worker's workers train mirrored's model) the fast recipe
# reached 0.90 in 2 epochs in only some seeds, in 3 in every one (docs/time-to-accuracy.md).
LONGER_FAST = {"fast": {"epochs": 3}}
LONGER_FAST_NOTE = "under tf.distribute it reaches 0.90 in every seed in 3"


def check_distributed(config) -> None:
    if config.jit_compile:
        raise UserError(
            "--jit_compile: under tf.distribute, Keras' step reads every replica's variables "
            "from one XLA computation, which XLA cannot place "
            "(https://www.tensorflow.org/xla/known_issues#tfvariable_on_a_different_device); "
            "--strategy=manual compiles each replica's pass, --strategy=plain Keras' step")


def check_plain(config) -> None:
    if config.num_gpus != 1:
        raise UserError(f"--strategy=plain trains on one device without tf.distribute; for "
                        f"--num_gpus={config.num_gpus} use --strategy=mirrored")


def under_tf_distribute(name: str, summary: str, **cluster) -> Path:
    """A path of Keras fit under a ``tf.distribute`` strategy: what it refuses and what a
    recipe takes otherwise there are the same for each."""
    return register(Path(name=name, summary=summary, trainer=TRAINER, refuses=UNDER_DISTRIBUTE,
                         recipe_overrides=LONGER_FAST, recipe_note=LONGER_FAST_NOTE,
                         check=check_distributed, **cluster))


under_tf_distribute("mirrored", "Keras fit under MirroredStrategy", keras_strategy=MIRRORED)
under_tf_distribute("multi_worker", "Keras fit under MultiWorkerMirroredStrategy (TF_CONFIG)",
                    keras_strategy=MULTI_WORKER_MIRRORED, cluster=WORKERS, scales_by="workers",
                    regroups=True)
register(Path(
    name="plain",
    summary="Keras fit on one device with no tf.distribute strategy (the baseline)",
    trainer=TRAINER,
    keras_strategy=KERAS_DEFAULT,
    cluster=NO_CLUSTER,
    own_flags={"steps_per_execution": OwnFlag(
        (1,), "Keras fit's steps per compiled call", "runs one step per call",
        help="training steps per compiled Keras call (fewer Python round trips; progress and "
             "callbacks then update every N steps).")},
    refuses={"sync_every": "Keras fit's own is --steps_per_execution"},
    check=check_plain,
))
