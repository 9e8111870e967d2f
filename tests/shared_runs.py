"""Small runs trained once per test session, through the one entry that trains
(``tfdp.training_run.train``, in the test process: no TensorFlow start of their own), each with
its run folder and its export, for every test that only reads what a run leaves: its export
served by other clients, its metrics, its report. A test that changes a run (resumes it, breaks
it, interrupts it) trains its own.

``conftest.shared_runs`` is the session's ``SharedRuns``: ``shared_runs("manual-lenet")`` trains
that run the first time a test asks, and hands every later test the same ``Result``.
"""

import dataclasses
import os

SERVED = "saved_model,onnx,litert"
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
            from tfdp import training_run
            from tfdp.config import Config

            folder = self.root / name
            self.done[name] = training_run.train(Config(
                **RUNS[name], data_dir=self.data_dir, workdir=str(folder / "run"),
                export_dir=str(folder / "export")))
        return self.done[name]
