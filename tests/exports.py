"""An export seen by serving clients tfdp never wrote: ``tests/serving_clients.py`` in a process
of its own."""

import json
import os
import subprocess
import sys

import numpy as np

from conftest import REPO


def serve_in_clients(version, images, labels, folder, margin=1e-4) -> dict:
    """What ``tests/serving_clients.py`` (a process that never imports tfdp) sees of the export
    ``version`` on ``images`` (uint8) and ``labels``, ``margin`` being how far ONNX's and
    LiteRT's logits may be from TF2's."""
    return serve_all_in_clients({version: (margin, len(labels))}, images, labels,
                                folder)[str(version)]


def serve_all_in_clients(exports: dict, images, labels, folder) -> dict:
    """``serve_in_clients`` of every export folder in ``exports`` (folder -> (margin, how many
    of the examples it is served on[, its own images, labels])), in one process: {folder: what
    its clients saw}."""
    np.save(folder / "images.npy", images)
    np.save(folder / "labels.npy", labels)
    items = []
    for i, (version, (margin, count, *own)) in enumerate(exports.items()):
        item = f"{version}={margin}={count}"
        if own:  # Data of another shape.
            for name, array in zip(("images", "labels"), own):
                np.save(folder / f"{name}-{i}.npy", array)
            item += f"={folder / f'images-{i}.npy'}={folder / f'labels-{i}.npy'}"
        items.append(item)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "serving_clients.py"),
         str(folder / "images.npy"), str(folder / "labels.npy"),
         *items],
        capture_output=True, text=True, timeout=900, cwd=folder,
        env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def runtimes_agree(seen: dict, examples: int, margin=1e-4) -> None:
    """ONNX Runtime and LiteRT (``serve_in_clients``) give TF2's classes, but for examples whose
    top two logits are within ``margin``, and logits within ``margin`` of their size."""
    for runtime in ("onnx", "litert"):
        assert seen[f"{runtime}_same_classes"] >= 1 - seen["near_ties"] / examples - 1e-9, seen
        assert seen[f"{runtime}_logits"] < margin, seen
