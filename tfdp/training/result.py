"""What every training path returns: ``tfdp.Result``."""

import dataclasses
from typing import Optional


@dataclasses.dataclass
class Result:
    """One finished run.

    ``test_accuracy`` is the test set's: the last epoch's evaluation, or, where a validation
    split (``--validation_split``) was evaluated after every epoch, the test set's evaluated
    once after training (NaN for data without a test set); ``validation_accuracy`` is then the
    last epoch's (None without one). ``history`` holds one dict per epoch, the records of
    ``metrics.json`` (``epoch``, ``loss``, ``train_acc``, ``test_loss``, ``test_acc``: the
    evaluated split's, ``seconds``, ``examples_per_sec``).
    ``weights`` are the trained weights in Keras order (``model.get_weights()``; for LeNet the
    same list on every path). ``export_path`` is None on a worker that is not the chief.
    """

    test_accuracy: float
    sec_per_epoch: float
    history: list
    export_path: Optional[str]
    devices: list
    run_dir: str
    final_line: str
    plan: object = dataclasses.field(repr=False)
    weights: list = dataclasses.field(repr=False)
    validation_accuracy: Optional[float] = None

    def plot(self):
        """The accuracy and loss per epoch as a matplotlib figure (a notebook draws it inline)."""
        from tfdp.training import history_chart

        return history_chart.figure(self.history, self.plan.epochs,
                                     f"{self.plan.strategy}, {len(self.devices)} device(s)",
                                     shown=True)
