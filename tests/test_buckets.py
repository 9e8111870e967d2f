"""--bucket_kb and --overlap (section 12.3.2): buckets in the backward pass's order, the same
model whatever the buckets or the barrier, and, in a traced step, the bucketed ring's exchange
starting while the backward pass still runs, where the barrier's waits for all of it."""

import json

import numpy as np
import pytest

from same_model import comparable_start, head, train_manual, update_difference
from tfdp.config.settings import Config
from tfdp.paths.manual.buckets import backward_order, buckets
from tfdp.training import entry
from tfdp.util.errors import UserError


def test_buckets_pack_the_backward_pass_order_up_to_the_cap():
    sizes = [600, 24, 9600, 64, 409600, 512, 40, 40]  # W1 b1 W2 b2 W3 b3 W4 b4, in bytes
    order = backward_order(sizes)
    assert order == [7, 6, 5, 4, 3, 2, 1, 0]
    assert buckets(sizes, order, 10 * 1024) == [[7, 6, 5], [4], [3, 2, 1], [0]]  # 10288 > 10240
    assert buckets(sizes, order, 1 << 30) == [order]


def manual_params(tmp_path, split, name, **flags):
    config = Config(num_gpus=2, batch_size=60, lr=0.1, epochs=1, seed=5, eval_steps=1,
                    precision="float64", allreduce="ring", workdir=str(tmp_path / name),
                    **flags)
    return train_manual(config, split, split, params=comparable_start(4, np.float64))[0]


def test_buckets_and_the_barrier_train_the_same_model(tmp_path, train_split):
    split, start = head(train_split, 300), comparable_start(4, np.float64)
    plain = manual_params(tmp_path, split, "plain")
    for name, flags in (("buckets", dict(bucket_kb=4)), ("barrier", dict(overlap="none"))):
        assert update_difference(manual_params(tmp_path, split, name, **flags), plain,
                                 start) < 1e-9, name


def exchange_against_backward(tmp_path, data_dir, name, **flags) -> list:
    """Per traced step and replica: (its allreduce's first op's start, its own backward pass's
    end, every replica's backward pass's end), ns."""
    entry.train(Config(num_gpus=2, batch_size=256, epochs=1, steps_per_epoch=6, eval_steps=1,
                        allreduce="ring", trace_steps="4:6", data_dir=data_dir,
                        workdir=str(tmp_path / name), export_dir=str(tmp_path / "exports"),
                        **flags))
    part = json.loads((tmp_path / name / "trace" / "chief.json").read_text())
    found = []
    for step in (4, 5, 6):
        events = [e for e in part["events"] if e["step"] == step]
        every = max(e["end_ns"] for e in events if e["class"] == "backward")
        for lane in ("replica 0", "replica 1"):
            own = [e for e in events if e["lane"] == lane]
            # The allreduce's own work: not the control edges that the barrier sends ahead.
            exchange = min(e["start_ns"] for e in own if "allreduce" in e["node"]
                           and e["name"] not in ("_Send", "_Recv"))
            backward = max(e["end_ns"] for e in own if e["class"] == "backward")
            found.append((exchange, backward, every))
    return found


@pytest.mark.slow
def test_a_bucketed_ring_starts_during_the_backward_pass_and_the_barrier_after(tmp_path,
                                                                              data_dir):
    # The ring flattens a replica's gradients once all of them exist; in 4 KB buckets, LeNet's
    # last layers' gradients travel while the first layers' are still being computed.
    plain = exchange_against_backward(tmp_path, data_dir, "plain")
    assert all(start >= own for start, own, _ in plain)
    bucketed = exchange_against_backward(tmp_path, data_dir, "buckets", bucket_kb=4)
    assert all(start < own for start, own, _ in bucketed)
    barrier = exchange_against_backward(tmp_path, data_dir, "barrier", overlap="none")
    assert all(start >= every for start, _, every in barrier)


def test_buckets_and_overlap_elsewhere_are_one_line_errors():
    with pytest.raises(UserError, match=r"^--bucket_kb=64 is --strategy=manual's \(the buckets "
                                        r"of its own allreduce\): --strategy=mirrored exchanges"):
        Config(strategy="mirrored", bucket_kb=64)
    with pytest.raises(UserError, match=r"^--overlap=none is --strategy=manual's"):
        Config(strategy="plain", overlap="none")
    with pytest.raises(UserError, match=r"^--overlap=some is not one of: auto, none$"):
        Config(overlap="some")
