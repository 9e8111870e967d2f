"""``python -m tfdp.bench --elastic`` (``tfdp.bench.elastic``): what an elastic group costs,
measured by real launches, and what the bench refuses or may kill."""

import json
import os
import subprocess
from types import SimpleNamespace

import pytest
from processes import run_module
from tfdp.bench import elastic
from tfdp.util.errors import UserError


@pytest.mark.cluster
def test_the_bench_measures_what_a_group_costs_and_how_soon_it_trains_again(tmp_path, data_dir):
    """``python -m tfdp.bench --elastic`` (tiny sizes: not a timing test): groups of two that
    lose nothing, fixed and elastic, and an elastic one that loses a worker; the table and the
    JSON hold every figure, the times after the kill in the order they happen, and the CPU an
    example costs the step with a survivor's marks and without."""
    # Steps enough for a worker to be lost while the second epoch trains (an epoch of 8 small
    # ones ended before the kill).
    result = run_module("tfdp.bench", "--elastic", "--workers=2", "--rounds=1", "--steps=40",
                        "--epochs=2", "--batch_size=256", "--elastic_step_rounds=1",
                        f"--data_dir={data_dir}",
                        f"--workdir={tmp_path}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    row, = json.loads((tmp_path / "elastic.json").read_text())
    assert row["path"] == "multi_worker"
    assert row["workers"] == 2 and row["rounds"] == 1 and len(row["runs"]) == 1
    assert row["fixed"] > 0 and row["elastic"] > 0, row
    assert 0 < row["to_left"] <= row["to_resumed"] <= row["to_training"] < 120, row
    assert 0 <= row["steps_again"] <= elastic.BACKUP_EVERY, row
    marks = row["marks"]  # The step with a survivor's marks, against without, by CPU.
    assert marks["rounds"] == 1 and marks["steps"] == 40 and marks["model"] == "lenet", marks
    assert marks["plain_us"] > 0 and marks["marked_us"] > 0, marks
    assert marks["ratio_range"][0] <= marks["ratio"] <= marks["ratio_range"][1], marks
    table = (tmp_path / "elastic.md").read_text()
    assert table.splitlines()[2].startswith(
        f"| multi_worker | 2 | {row['fixed']:.0f} | {row['elastic']:.0f} | ")
    assert marks["medians_ratio"] == marks["marked_us"] / marks["plain_us"], marks
    assert (f"{marks['marked_us']:.0f} CPU-microseconds an example against "
            f"{marks['plain_us']:.0f} (medians: {marks['medians_ratio']:.3f}); the rounds' "
            f"ratios {marks['ratio']:.3f}") in table, table


@pytest.mark.parametrize("workers, settings, paths, words", [
    ([1, 2], dict(epochs=3, steps=60), ["manual"], "an elastic group needs at least 2 workers"),
    ([2], dict(epochs=1, steps=60), ["multi_worker"],
     "give --epochs=2 or more and --steps=8 or more"),
    ([2], dict(epochs=3, steps=60), ["plain"],
     "--elastic_paths=plain: give multi_worker or manual"),
])
def test_the_bench_refuses_what_it_cannot_measure(workers, settings, paths, words):
    with pytest.raises(UserError, match=words):
        elastic.measure(workers, 1, SimpleNamespace(**settings), paths=paths)


def test_the_bench_kills_a_worker_or_a_server_never_the_client():
    """The processes the elastic bench may kill: a launcher's children whose TF_CONFIG task is a
    worker (``multi_worker``'s, or the from-scratch client's servers), not the client."""
    tasks = {"chief": 0, "worker": 1}
    children = [subprocess.Popen(["sleep", "30"], env=dict(os.environ, TF_CONFIG=json.dumps(
        {"cluster": {}, "task": {"type": kind, "index": index}})))
        for kind, index in tasks.items()]
    children.append(subprocess.Popen(["sleep", "30"]))  # No TF_CONFIG: not a task.
    try:
        assert elastic._workers(os.getpid()) == [children[1].pid]
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert elastic._progress("manual").match("[chief] epoch 2/3 17/60 [===>...")
    assert elastic._resumed("manual").match("[chief] resuming at epoch 2/3, step 4/60 "
                                            "(global step 64)")[1] == "64"
    assert not elastic._progress("multi_worker").match("[1] epoch 2/3 17/60 [===>...")
