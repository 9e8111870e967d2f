"""Every path's export loads and serves in clients nobody in this project wrote, with the
accuracy the run reported: the TF1 session loader (what TF Serving's C++ loader does),
``saved_model_cli run``, TF2's loader, Keras' ``TFSMLayer``, and, for the ONNX and LiteRT files
beside it (``--export_formats``), ONNX Runtime and LiteRT's interpreter. The clients run in
``tests/serving_clients.py``, a process that never imports tfdp."""

import json
import os
import stat

import pytest

from exports import runtimes_agree, serve_in_clients
from processes import run_module

CONTRACT = {"inputs": {"images": ["uint8", [-1, 28, 28, 1]]},
            "outputs": {"logits": ["float32", [-1, 10]], "probabilities": ["float32", [-1, 10]],
                        "classes": ["int64", [-1]]}}


# ONNX and LiteRT carry the contract's names and dtypes; LiteRT's input is [1, 28, 28, 1] with the
# batch free (its shape signature), resized to each call's batch.
ONNX_CONTRACT = {"inputs": {"images": "tensor(uint8)"},
                 "outputs": {"classes": "tensor(int64)", "logits": "tensor(float)",
                             "probabilities": "tensor(float)"}}
LITERT_CONTRACT = {"inputs": {"images": ["uint8", [-1, 28, 28, 1]]},
                   "outputs": {"classes": "int64", "logits": "float32",
                               "probabilities": "float32"}}


@pytest.mark.parametrize("strategy, model, batch, lr, precision, recipe", [
    ("manual", "lenet", 100, 0.2, "float32", "textbook"),
    ("mirrored", "lenet", 100, 0.2, "float32", "textbook"),
    ("manual", "lenet", 100, 0.2, "bfloat16", "textbook"),
    # The fast recipe's export: lenet_bn's running statistics, and the flipped evaluation.
    ("manual", "lenet_bn", 100, 0.2, "float32", "fast"),
    # At lr 0.2 a 20-step ResNet diverges (test loss 2,399, logits in the thousands, in a run
    # here), and in one CI run TFLite's classes then disagreed with TF's (accuracy 0 against
    # 0.125): a diverged model is no test of a serving client.
    ("mirrored", "resnet18", 16, 0.02, "float32", "textbook")])
@pytest.mark.slow
def test_export_serves_in_every_client(tmp_path, data_dir, test_split, strategy, model, batch,
                                       lr, precision, recipe):
    eval_steps = 2
    result = run_module("tfdp.train", f"--recipe={recipe}", f"--strategy={strategy}",
                        f"--model={model}",
                        "--num_gpus=2", f"--batch_size={batch}", "--epochs=1",
                        "--steps_per_epoch=20", f"--eval_steps={eval_steps}", "--init=glorot",
                        f"--lr={lr}", f"--precision={precision}",
                        "--export_formats=saved_model,onnx,litert",
                        f"--data_dir={data_dir}", f"--workdir={tmp_path / 'work'}",
                        f"--export_dir={tmp_path / 'exp'}")
    assert result.returncode == 0, result.stderr[-3000:]
    reported = json.loads((tmp_path / "work" / "metrics.json").read_text())["epochs"][-1]
    export = tmp_path / "exp" / "1"
    # A model server running as another user can read every folder and file.
    for folder, _, files in os.walk(export):
        assert stat.S_IMODE(os.stat(folder).st_mode) & 0o555 == 0o555, folder
        for name in files:
            assert stat.S_IMODE(os.stat(os.path.join(folder, name)).st_mode) & 0o444 == 0o444

    examples = eval_steps * batch  # The test examples the run's accuracy covers.
    # ONNX and LiteRT compute in float32; a bfloat16-trained SavedModel in bfloat16: its logits
    # differ by bfloat16's rounding, bounded in tfdp/export_formats.py by 2^-5 of their size.
    margin = 2.0 ** -5 if precision == "bfloat16" else 1e-4
    seen = serve_in_clients(export, test_split.images[:examples], test_split.labels[:examples],
                            tmp_path, margin)
    assert seen["signature"] == CONTRACT
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
    assert seen["onnx_signature"] == ONNX_CONTRACT and seen["litert_signature"] == LITERT_CONTRACT
    # Float32: measured about 1e-7, kernels of another order; bfloat16: see the margin.
    runtimes_agree(seen, examples, margin)
    assert seen["litert_bytes"] > (100_000 if model.startswith("lenet") else 10_000_000)  # Weights.
