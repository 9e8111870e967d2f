"""A path of the tests' own, declared in this one module and nowhere else: ``--strategy=toy``,
Keras ``fit`` without tf.distribute under another name, whose tasks make a cluster of workers.
``tests/test_path_registry.py`` checks that the flags, ``--help``, the launcher, the bench and
``tfdp.run`` take it; ``$TFDP_PATHS=toy_path`` registers it in a process started there. It
trains with tfdp's Keras path under the strategy its description names, as a new Keras-based
path would."""

from tfdp.paths import KERAS_DEFAULT, WORKERS, OwnFlag, Path, register
from tfdp.util.errors import UserError


def check(config) -> None:
    if config.num_gpus != 1:
        raise UserError(f"--num_gpus={config.num_gpus}: --strategy=toy trains on one device")


def training_path():
    """Made when a run starts: TensorFlow is imported only then."""
    from tfdp.paths.keras.trainer import KerasFitPath

    class ToyPath(KerasFitPath):
        def __init__(self, resolved, backups):
            super().__init__(resolved, backups)
            self.engine = f"the toy path: {self.engine}"

    return ToyPath


TOY = register(Path(
    name="toy",
    summary="the tests' toy path (Keras fit, one device)",
    trainer=training_path,
    keras_strategy=KERAS_DEFAULT,
    cluster=WORKERS,
    scales_by="workers",
    models=("lenet",),
    models_note="a toy",
    own_flags={"steps_per_execution": OwnFlag((1,), "Keras fit's steps per call",
                                              "runs one step per call")},
    defaults={"init": "textbook"},
    check=check,
))
