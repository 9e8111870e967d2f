"""Where the model goes wrong, image by image (``tfdp.training.mistakes``): the most confident
mistakes of a run's final evaluation, found by its export, in ``metrics.json``, drawn in
``mistakes.png`` and in TensorBoard."""

import json

import numpy as np
import pytest

from shared_runs import COLOUR_NAMES, RUNS, colour_images
from tfdp.data import fashion_mnist
from tfdp.training import mistakes

# Read from the shared runs (tests/shared_runs.py), trained once in this worker.
pytestmark = pytest.mark.xdist_group("shared_runs")


def test_the_most_confident_wrong_predictions_come_first():
    """Counted by hand: right predictions are never shown, however confident; wrong ones by
    their wrong class's probability, ties in the split's order."""
    probabilities = np.array([[0.9, 0.1, 0.0],    # right
                              [0.2, 0.7, 0.1],    # wrong (true 0), 0.7
                              [0.1, 0.1, 0.8],    # wrong (true 1), 0.8
                              [0.6, 0.4, 0.0],    # wrong (true 2), 0.6
                              [0.1, 0.7, 0.2]])   # wrong (true 2), 0.7: after example 1
    labels = np.array([0, 0, 1, 2, 2])
    assert mistakes.most_confidently_wrong(probabilities, labels).tolist() == [2, 1, 4, 3]
    assert mistakes.most_confidently_wrong(probabilities, labels, count=2).tolist() == [2, 1]
    assert mistakes.most_confidently_wrong(probabilities[:1], labels[:1]).tolist() == []


@pytest.mark.parametrize("name", ["manual-lenet", "mirrored-lenet", "manual-yours-colour"])
@pytest.mark.slow
def test_a_run_shows_the_examples_its_export_gets_most_confidently_wrong(
        shared_runs, test_split, name):
    """The shown mistakes are the export's own most confident ones on the examples the final
    evaluation covered (here ``--eval_steps=2`` batches), by class name, in metrics.json, in
    mistakes.png and in TensorBoard; about as many wrong as the run's accuracy says."""
    import tensorflow as tf

    result = shared_runs(name)
    examples = RUNS[name]["eval_steps"] * RUNS[name]["batch_size"]
    if RUNS[name].get("dataset") == "npz:colour":
        images, labels = colour_images(test_split, examples)
        names = COLOUR_NAMES
    else:
        images, labels = test_split.images[:examples], np.asarray(test_split.labels[:examples])
        names = fashion_mnist.LABEL_NAMES
    serve = tf.saved_model.load(result.export_path).signatures["serving_default"]
    probabilities = serve(images=tf.constant(np.asarray(images)))["probabilities"].numpy()
    predicted = probabilities.argmax(axis=1)
    wrong = np.flatnonzero(predicted != labels)
    # The run's own evaluation counted the same mistakes but for rounding ties.
    assert abs(len(wrong) / examples - (1 - result.history[-1]["test_acc"])) <= 0.02

    metrics = json.loads(open(f"{result.run_dir}/metrics.json").read())
    shown = metrics["mistakes"]["shown"]
    assert metrics["mistakes"]["split"] == "test"
    assert len(shown) == min(mistakes.SHOWN, len(wrong)) and shown
    confidence = probabilities[wrong, predicted[wrong]]
    threshold = np.sort(confidence)[::-1][len(shown) - 1]
    for mistake in shown:
        i = mistake["index"]
        assert i in wrong and mistake["true"] == names[labels[i]]
        assert mistake["predicted"] == names[predicted[i]]
        assert mistake["confidence"] == pytest.approx(probabilities[i].max(), abs=1e-5)
        assert mistake["confidence"] >= threshold - 1e-5  # None more confident left out.
    assert [m["confidence"] for m in shown] == sorted((m["confidence"] for m in shown),
                                                      reverse=True)
    png = open(f"{result.run_dir}/{mistakes.FILE}", "rb").read()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    tags = set()
    for event_file in tf.io.gfile.glob(f"{result.run_dir}/tensorboard/test/events.*"):
        for event in tf.compat.v1.train.summary_iterator(event_file):
            tags.update(value.tag for value in event.summary.value)
    assert {"mistakes", "confusion"} <= tags


def test_a_client_that_cannot_read_the_split_warns_and_shows_no_mistakes(monkeypatch, caplog):
    """A cluster's client on a machine without the data (its workers read it): the run keeps
    its export, says in a warning why it has no grid, and reports none."""
    from types import SimpleNamespace

    from tfdp.data import pipeline
    from tfdp.training import lifecycle

    def unreadable(dataset, split):
        raise FileNotFoundError(2, "No such file or directory", f"/data/{split}.npz")

    monkeypatch.setattr(pipeline, "load", unreadable)
    shown = []
    run = SimpleNamespace(
        config=SimpleNamespace(synthetic_data=False), dataset=None, test_split=None,
        eval_split=None, reporter=SimpleNamespace(is_chief=True,
                                                  mistakes=lambda *a: shown.append(a)),
        plan=SimpleNamespace(tested=False, evaluated="test", eval_examples=200))
    lifecycle._mistakes(run, "/nowhere/1")  # Never opened: the split is read first.
    assert not shown
    assert ("no mistakes.png: the test split is not readable here ([Errno 2] No such file or "
            "directory: '/data/test.npz')" in caplog.text)
