"""A run's accuracy and loss per epoch, train and evaluated, drawn: ``accuracy.png`` in the run
folder (``Chart``), and ``tfdp.Result.plot()`` in a notebook."""

import os
import time

from tfdp.util import charts, files

FILE = "accuracy.png"
REDRAW_EVERY = 30.0  # Seconds of a run between two drawings of accuracy.png while it trains.


class Chart:
    """``accuracy.png`` in ``workdir``: drawn when the run ends (``draw``), and while it trains at
    an epoch's end once ``REDRAW_EVERY`` seconds have passed since the run started or the chart
    was last drawn (``epoch_end``). Drawing costs a process matplotlib's import and a fraction
    of a second a chart (docs/design.md#tests): an epoch of a few seconds would pay that every
    epoch, inside time to accuracy's clock, for a picture nobody looks at until the run ends;
    an epoch of minutes redraws it every epoch. A run stopped early (a preemption, an error)
    keeps the last drawing; ``metrics.json`` and TensorBoard have every epoch."""

    def __init__(self, workdir: str, epochs: int, title: str):
        self.path, self.epochs, self.title = os.path.join(workdir, FILE), epochs, title
        self._since = time.monotonic()
        self._drawn = None  # The records drawn last.

    def epoch_end(self, records: list) -> None:
        if time.monotonic() - self._since >= REDRAW_EVERY:
            self.draw(records)

    def draw(self, records: list) -> None:
        """Draw ``records`` now, unless they are the ones drawn last (or none)."""
        if not records or records == self._drawn:
            return
        fig = figure(records, self.epochs, self.title)
        files.write_atomic(self.path, lambda f: fig.savefig(f, format="png", dpi=100), mode="wb")
        self._drawn = [dict(r) for r in records]
        self._since = time.monotonic()


def figure(records: list, epochs: int, title: str, shown: bool = False):
    """Train and test accuracy and loss against epochs, as a matplotlib figure: ``shown``, one
    of pyplot's (a notebook draws it inline), else a figure of its own, which a file needs and
    which spares the process importing pyplot."""
    from matplotlib.ticker import MaxNLocator

    if shown:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(8, 3.5))
    else:
        fig = charts.figure(8, 3.5)
    acc_ax, loss_ax = fig.subplots(1, 2)
    epoch_numbers = [r["epoch"] for r in records]
    for ax, pairs, name in ((acc_ax, (("train_acc", "train"), ("test_acc", "test")), "accuracy"),
                            (loss_ax, (("loss", "train"), ("test_loss", "test")), "loss")):
        for key, label in pairs:
            ax.plot(epoch_numbers, [r[key] for r in records], marker="o", label=label)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(0.5, max([epochs, *epoch_numbers]) + 0.5)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig
