"""Every path's export loads and serves in clients nobody in this project wrote, with the
accuracy the run reported: the TF1 session loader (what TF Serving's C++ loader does),
``saved_model_cli run``, TF2's loader, Keras' ``TFSMLayer``, and, for the ONNX and LiteRT files
beside it (``--export_formats``), ONNX Runtime and LiteRT's interpreter. The clients run in
``tests/serving_clients.py``, a process that never imports tfdp."""

import os
import stat

import pytest

from exports import runtimes_agree, serve_all_in_clients
from shared_runs import COLOUR_NAMES, RUNS, colour_images
from tfdp.data import fashion_mnist

def contract(shape=(28, 28, 1), classes=10) -> dict:
    """The serving contract of an export of ``shape`` images in ``classes`` classes."""
    return {"inputs": {"images": ["uint8", [-1, *shape]]},
            "outputs": {"logits": ["float32", [-1, classes]],
                        "probabilities": ["float32", [-1, classes]],
                        "classes": ["int64", [-1]], "class_names": ["string", [-1]]}}



# ONNX and LiteRT carry the contract's names and dtypes; LiteRT's input is [1, 28, 28, 1] with the
# batch free (its shape signature), resized to each call's batch.
ONNX_CONTRACT = {"inputs": {"images": "tensor(uint8)"},
                 "outputs": {"classes": "tensor(int64)", "logits": "tensor(float)",
                             "probabilities": "tensor(float)",
                             "class_names": "tensor(string)"}}
def litert_contract(shape=(28, 28, 1)) -> dict:
    return {"inputs": {"images": ["uint8", [-1, *shape]]},
            "outputs": {"classes": "int64", "logits": "float32", "probabilities": "float32",
                        "class_names": "bytes"}}


EVAL_STEPS = 2  # The shared runs' evaluation (tests/shared_runs.py).


def coloured(name: str) -> bool:
    """Whether shared run ``name`` trains on the colour images of ``shared_runs.colour``."""
    return RUNS[name].get("dataset") == "npz:colour"

# One worker serves them all (xdist_group): the runs are trained and served once.
pytestmark = pytest.mark.xdist_group("shared_runs")


@pytest.fixture(scope="module")
def served(shared_runs, test_split, tmp_path_factory):
    """Every shared run's export, seen by every client, in one clients' process:
    {run name: (its Result, the examples its accuracy covers, the margin, what was seen)}."""
    runs = {name: shared_runs(name) for name in RUNS}
    examples = {name: EVAL_STEPS * RUNS[name]["batch_size"] for name in RUNS}
    largest = max(examples.values())
    # ONNX and LiteRT compute in float32; a bfloat16-trained SavedModel in bfloat16: its logits
    # differ by bfloat16's rounding, bounded in tfdp/export/formats.py by 2^-5 of their size.
    margins = {name: 2.0 ** -5 if RUNS[name].get("precision") == "bfloat16" else 1e-4
               for name in runs}
    # Your data of another shape is served its own test images (tests/shared_runs.py).
    colour = colour_images(test_split, largest)
    seen = serve_all_in_clients({r.export_path: (margins[name], examples[name],
                                                 *(colour if coloured(name) else ()))
                                 for name, r in runs.items()},
                                test_split.images[:largest], test_split.labels[:largest],
                                tmp_path_factory.mktemp("clients"))
    return {name: (r, examples[name], margins[name], seen[r.export_path])
            for name, r in runs.items()}


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.slow
def test_export_serves_in_every_client(served, name):
    result, examples, margin, seen = served[name]
    precision = RUNS[name].get("precision", "float32")
    reported = result.history[-1]
    export = result.export_path
    # A model server running as another user can read every folder and file.
    for folder, _, files in os.walk(export):
        assert stat.S_IMODE(os.stat(folder).st_mode) & 0o555 == 0o555, folder
        for file_name in files:
            mode = os.stat(os.path.join(folder, file_name)).st_mode
            assert stat.S_IMODE(mode) & 0o444 == 0o444

    shape, names = ((32, 32, 3), COLOUR_NAMES) if coloured(name) else (
        (28, 28, 1), fashion_mnist.LABEL_NAMES)
    assert seen["signature"] == contract(shape)
    # Every client names each class as TF2 does (else its accuracy is NaN, below), and TF2 by
    # the dataset's label names.
    assert all(n == names[int(c)] for c, n in seen["names_by_class"].items())
    assert seen["names_by_class"], seen
    assert seen["logits_finite"], "the run diverged: accuracies would compare ties of NaNs"
    # Exact, but for examples whose top two logits tie to rounding (another device count,
    # another client's kernels). A run whose replicas evaluated with batch-norm statistics of
    # their own failed here (tfdp/models/replicated_batch_norm.py).
    # A bfloat16 run evaluated in bfloat16 on its replicas' shards, the export on one batch:
    # bfloat16's rounding (the margin) breaks near ties either way between the two.
    allowed = seen["near_ties" if precision == "bfloat16" else "ties"] / examples + 1e-9
    for client in ("tf1_session", "saved_model_cli", "tf2_loader", "tfsm_layer"):
        assert seen[client] == pytest.approx(reported["test_acc"], abs=allowed), (
            client, seen, reported["test_acc"])
    for client in ("onnx_runtime", "litert"):
        assert seen[client] == pytest.approx(reported["test_acc"],
                                             abs=seen["near_ties"] / examples + 1e-9), (
            client, seen, reported["test_acc"])
    assert seen["onnx_signature"] == dict(ONNX_CONTRACT, class_names=list(names))
    # The classes travel with the model: its asset, its labels signature, ONNX's and LiteRT's
    # metadata.
    assert seen["labels_txt"] == seen["labels_signature"] == list(names)
    assert seen["litert_signature"] == dict(litert_contract(shape), class_names=list(names))
    # Float32: measured about 1e-7, kernels of another order; bfloat16: see the margin.
    runtimes_agree(seen, examples, margin)
    # The weights are in it: at least the kernels' float32 bytes.
    assert seen["litert_bytes"] > 4 * sum(w.size for w in result.weights if w.ndim > 1)
