"""Where the model goes wrong: the confusion matrix of a run's final evaluation, counted by every
path's evaluation step as it evaluates (``tfdp.models.loss.confusion``: no second pass), for
``metrics.json`` and drawn as ``confusion.png``.

Rows are the true classes, columns the predicted ones; a cell's colour is its share of its row
(so a rare class shows as clearly as a common one), its text the count where the matrix is
small enough to read (``_NUMBERED``). The classes the model gets most wrong head the record.
"""

import numpy as np

from tfdp.util import charts

FILE = "confusion.png"
_NUMBERED = 20  # Classes up to which every cell's count is written in it.


def record(counts: np.ndarray, class_names, split: str) -> dict:
    """``metrics.json``'s ``confusion``: the counts, each class's accuracy (its diagonal cell
    over its row; None for a class with no example evaluated) and its most common mistakes."""
    counts = np.asarray(counts, np.int64)
    rows = counts.sum(axis=1)
    accuracy = [float(counts[k, k] / rows[k]) if rows[k] else None for k in range(len(rows))]
    off = counts.copy()
    np.fill_diagonal(off, 0)
    mistakes = [{"true": class_names[t], "predicted": class_names[p], "count": int(off[t, p])}
                for t, p in zip(*np.unravel_index(np.argsort(-off, axis=None, kind="stable"),
                                                  off.shape)) if off[t, p]][:10]
    return {"split": split, "class_names": list(class_names), "counts": counts.tolist(),
            "per_class_accuracy": accuracy, "most_confused": mistakes}


def figure(counts: np.ndarray, class_names, title: str):
    """The confusion matrix as a matplotlib figure of its own (``charts``)."""
    counts = np.asarray(counts, np.int64)
    k = len(class_names)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    side = min(4 + 0.45 * k, 16)
    fig = charts.figure(side + 1.5, side)
    ax = fig.subplots()
    shown = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    ticks = range(k) if k <= 2 * _NUMBERED else range(0, k, max(1, k // 20))
    ax.set_xticks(list(ticks), [class_names[i] for i in ticks], rotation=90, fontsize=8)
    ax.set_yticks(list(ticks), [class_names[i] for i in ticks], fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if k <= _NUMBERED:
        for (t, p), count in np.ndenumerate(counts):
            if count:
                ax.text(p, t, str(count), ha="center", va="center", fontsize=7,
                        color="white" if shares[t, p] > 0.5 else "black")
    correct = int(np.trace(counts))
    ax.set_title(f"{title}: {correct} of {int(counts.sum())} right", fontsize=9)
    fig.tight_layout()
    return fig
