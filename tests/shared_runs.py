"""Small runs trained once per test session, through the one entry that trains
(``tfdp.training.entry.train``, in the test process: no TensorFlow start of their own), each with
its run folder and its export, for every test that only reads what a run leaves: its export
served by other clients, its metrics, its report. A test that changes a run (resumes it, breaks
it, interrupts it) trains its own.

``conftest.shared_runs`` is the session's ``SharedRuns``: ``shared_runs("manual-lenet")`` trains
that run the first time a test asks, and hands every later test the same ``Result``.
"""

import dataclasses
import os

import numpy as np

from tfdp.data import fashion_mnist

SERVED = "saved_model,onnx,litert"
# The runs whose charts tests read (test_mistakes): the others draw none (conftest).
DRAWN = ("manual-lenet", "mirrored-lenet", "manual-yours-colour")
# A user's own model, from a file outside the package (docs/your-model.md).
YOURS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "own_models",
                     "residual_cnn.py") + ":residual_cnn"
# name -> the flags of tfdp.train (tfdp.run's keywords) besides the data and the folders.
RUNS = {
    "manual-lenet": dict(strategy="manual", num_gpus=2, batch_size=100, lr=0.2, epochs=1,
                         steps_per_epoch=20, eval_steps=2, init="glorot",
                         export_formats=SERVED),
    "mirrored-lenet": dict(strategy="mirrored", num_gpus=2, batch_size=100, lr=0.2, epochs=1,
                           steps_per_epoch=20, eval_steps=2, init="glorot",
                           export_formats=SERVED),
    "manual-lenet-bfloat16": dict(strategy="manual", num_gpus=2, batch_size=100, lr=0.2,
                                  epochs=1, steps_per_epoch=20, eval_steps=2, init="glorot",
                                  precision="bfloat16", export_formats=SERVED),
    # The fast recipe's export: lenet_bn's running statistics, and the flipped evaluation.
    "manual-lenet_bn-fast": dict(strategy="manual", recipe="fast", num_gpus=2, batch_size=100,
                                 lr=0.2, epochs=1, steps_per_epoch=20, eval_steps=2,
                                 precision="float32", export_formats=SERVED),
    # At lr 0.2 a 20-step ResNet diverges (test loss 2,399, logits in the thousands, in a run
    # here), and in one CI run TFLite's classes then disagreed with TF's (accuracy 0 against
    # 0.125): a diverged model is no test of a serving client.
    # Your model, batch normalization and all, from scratch through stateless_call.
    "manual-yours": dict(strategy="manual", model=YOURS, num_gpus=2, batch_size=100, lr=0.05,
                         momentum=0.9, epochs=1, steps_per_epoch=20, eval_steps=2,
                         export_formats=SERVED),
    # Your model on your data of another shape: 32 x 32 colour images in named classes.
    "manual-yours-colour": dict(strategy="manual", model=YOURS, dataset="npz:colour",
                                num_gpus=2, batch_size=100, lr=0.05, momentum=0.9, epochs=1,
                                steps_per_epoch=20, eval_steps=2, export_formats=SERVED),
    "mirrored-resnet18": dict(strategy="mirrored", model="resnet18", num_gpus=2, batch_size=16,
                              lr=0.02, epochs=1, steps_per_epoch=8, eval_steps=2,
                              init="glorot", export_formats=SERVED),
}


@dataclasses.dataclass
class SharedRuns:
    root: object        # a pathlib.Path for the runs' folders
    data_dir: str
    done: dict = dataclasses.field(default_factory=dict)

    def __call__(self, name: str):
        """The ``Result`` of run ``name`` (``RUNS``), trained at the first call."""
        if name not in self.done:
            from tfdp.config.settings import Config
            from tfdp.training import entry

            folder = self.root / name
            flags = dict(RUNS[name], plots=name in DRAWN)
            if flags.get("dataset") == "npz:colour":
                flags["dataset"] = f"npz:{self.colour()}"
            self.done[name] = entry.train(Config(
                **flags, data_dir=self.data_dir, workdir=str(folder / "run"),
                export_dir=str(folder / "export")))
        return self.done[name]

    def colour(self) -> str:
        """An .npz file of data of another shape (``colour_images``): its path."""
        path = self.root / "colour.npz"
        if not path.exists():
            from tfdp.data import pipeline

            arrays = {}
            for split, count in (("train", 2000), ("test", 200)):
                images, labels = colour_images(pipeline.load_split(split, self.data_dir), count)
                arrays.update({f"x_{split}": images, f"y_{split}": labels})
            np.savez(path, **arrays, class_names=np.array(COLOUR_NAMES))
        return str(path)


# Each Fashion-MNIST class tinted a colour of its own, named after both.
COLOUR_NAMES = [f"{name} ({colour})" for name, colour in zip(
    fashion_mnist.LABEL_NAMES, ("red", "green", "blue", "yellow", "cyan", "magenta", "orange",
                                "teal", "purple", "grey"))]
_TINTS = np.array([[1, .2, .2], [.2, 1, .2], [.2, .2, 1], [1, 1, .2], [.2, 1, 1], [1, .2, 1],
                   [1, .6, .2], [.2, .6, .6], [.6, .2, .6], [.6, .6, .6]])


def colour_images(split, count):
    """The first ``count`` images of ``split`` as 32 x 32 x 3 uint8 (padded by 2 pixels on each
    side, tinted by class), and their labels."""
    gray = np.asarray(split.images[:count], np.float32).reshape(count, 28, 28, 1)
    labels = np.asarray(split.labels[:count])
    padded = np.pad(gray, ((0, 0), (2, 2), (2, 2), (0, 0)))
    return np.round(padded * _TINTS[labels][:, None, None, :]).astype(np.uint8), labels
