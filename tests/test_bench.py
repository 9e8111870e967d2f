"""The benchmark runs every kind of configuration and writes a well-formed table (tiny sizes:
these are not timing tests; speed is checked by running tfdp.bench, not by the suite)."""

import json

from conftest import run_module


def test_bench_writes_table_json_and_chart(tmp_path, data_dir):
    result = run_module("tfdp.bench", "--configs=stock:1,manual:1,manual:2:ring,mirrored:2",
                        "--steps=3", "--epochs=2", "--rounds=1", "--batch_size=64",
                        "--allreduce", "--allreduce_sizes=4096", f"--data_dir={data_dir}",
                        f"--workdir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == ["stock:1", "manual:1", "manual:2:ring", "mirrored:2"]
    for row in rows.values():
        assert row["examples_per_sec"] > 0 and row["min"] <= row["examples_per_sec"] <= row["max"]
        assert 0 < row["flops_fraction"] < 1
        assert row["vs_stock"] > 0
    assert rows["manual:2:ring"]["allreduce"] == "ring"
    assert rows["manual:2:ring"]["speedup"] > 0  # Against manual:1.
    assert report["matmul_gflops"] > 1
    assert 13e6 < report["training_flops_per_example"] < 14e6  # LeNet: 3 x 4.5 MFLOP
    algorithms = {r["algorithm"] for r in report["allreduce"]["rows"]}
    assert {"add_n", "sharded", "ring", "ReductionToOneDevice", "CollectiveAllReduce"} <= algorithms
    assert all(r["k"] in (2, 3, 4) for r in report["allreduce"]["rows"])
    table = (tmp_path / "bench.md").read_text()
    assert table.count("\n| manual:") == 2 and "| add_n | 2 | 4 KB |" in table
    assert (tmp_path / "bench.png").stat().st_size > 1000


def test_bench_refuses_a_malformed_config(tmp_path):
    result = run_module("tfdp.bench", "--configs=manual", f"--workdir={tmp_path}")
    assert result.returncode != 0 and "expected path:devices" in result.stderr
