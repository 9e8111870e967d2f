"""Where the model goes wrong, image by image: the images of a run's final evaluation that its
export gets wrong most confidently, drawn as a grid (``mistakes.png``) with their true and
predicted class names, and listed in ``metrics.json``'s ``mistakes``.

Found by the export itself (its ``serving_default``, as ``tfdp.predict`` calls it, a batch a
call) in one pass over the split the run evaluated last, on the chief, after the export is
written: the mistakes shown are those of the model a user deploys, whatever path trained it
(the paths' evaluation steps sum a split across replicas and workers, and keep no example's
prediction). A mistake's confidence is the probability the model gave its wrong class; ties keep
the split's order.
"""

import numpy as np

from tfdp.util import charts

FILE = "mistakes.png"
SHOWN = 16  # Images in the grid and in metrics.json.
_BATCH = 1024  # Images per call of the export.


def most_confidently_wrong(probabilities: np.ndarray, labels: np.ndarray,
                           count: int = SHOWN) -> np.ndarray:
    """Indices of the (at most ``count``) examples whose predicted class is wrong, the most
    probable wrong prediction first."""
    predicted = probabilities.argmax(axis=1)
    wrong = np.flatnonzero(predicted != labels)
    confidence = probabilities[wrong, predicted[wrong]]
    return wrong[np.argsort(-confidence, kind="stable")[:count]]


def find(serve, images, labels, class_names, count: int = SHOWN) -> list:
    """The ``count`` most confident mistakes of ``serve(uint8 images) -> probabilities`` on
    ``images``/``labels``: ``[{index, true, predicted, confidence}]``, most confident first."""
    labels = np.asarray(labels)
    probabilities = np.concatenate([serve(np.asarray(images[i:i + _BATCH]))
                                    for i in range(0, len(labels), _BATCH)])
    return [{"index": int(i), "true": class_names[labels[i]],
             "predicted": class_names[int(probabilities[i].argmax())],
             "confidence": float(probabilities[i].max())}
            for i in most_confidently_wrong(probabilities, labels, count)]


def figure(images, mistakes: list, title: str):
    """The ``mistakes`` (``find``'s) of ``images`` as a grid: each image under its index, true
    and predicted names and the confidence. One mosaic in one axes (a subplot an image took
    most of a run's drawing time)."""
    columns = min(4, max(1, len(mistakes)))
    rows = max(1, -(-len(mistakes) // columns))
    height, width, channels = np.asarray(images[0]).shape
    gap, caption = max(2, width // 14), height // 2  # Pixels between images; above each.
    cell_h, cell_w = height + caption, width + gap
    mosaic = np.full((rows * cell_h, columns * cell_w, 3), 255, np.uint8)
    for k, mistake in enumerate(mistakes):
        top, left = (k // columns) * cell_h + caption, (k % columns) * cell_w
        mosaic[top:top + height, left:left + width] = np.asarray(images[mistake["index"]])
    inches = 2.0 * columns  # Wide; as high as the mosaic, and the title above it.
    drawn = inches * mosaic.shape[0] / mosaic.shape[1]
    fig = charts.figure(inches, drawn + 0.35)
    ax = fig.add_axes((0, 0, 1, drawn / (drawn + 0.35)))
    ax.imshow(mosaic, interpolation="nearest")
    for k, mistake in enumerate(mistakes):
        ax.text((k % columns) * cell_w + width / 2, (k // columns) * cell_h + caption - 1,
                f"#{mistake['index']} true: {mistake['true']}\npredicted: "
                f"{mistake['predicted']} ({mistake['confidence']:.2f})",
                ha="center", va="bottom", fontsize=7)
    ax.axis("off")
    fig.suptitle(title if mistakes else f"{title}: none wrong", fontsize=9)
    return fig
