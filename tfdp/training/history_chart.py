"""A run's accuracy and loss per epoch, train and evaluated, drawn: ``accuracy.png`` in the run
folder after every epoch, and ``tfdp.Result.plot()`` in a notebook."""

from tfdp.util import charts

FILE = "accuracy.png"


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
