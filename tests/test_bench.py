"""The benchmark runs every kind of configuration and writes a well-formed table (tiny sizes:
these are not timing tests; speed is checked by running tfdp.bench, not by the suite)."""

import json
from types import SimpleNamespace

import pytest

from processes import AS_FROM_A_SHELL, left_behind, run_module
from tfdp.paths.manual import algorithms
from tfdp.bench import references
from tfdp.bench import time_to_accuracy as tta
from tfdp.config.recipes import RECIPES
from tfdp.config.settings import Config
from tfdp.util import logs
from tfdp.util.errors import UserError


@pytest.mark.slow
def test_bench_writes_table_json_and_chart(tmp_path, data_dir):
    result = run_module("tfdp.bench", "--configs=stock:1,manual:1,manual:2:ring,manual:2:ring:bf16,"
                        "plain:1:bf16:spe=2:intra=1:inter=1",
                        "--steps=3", "--epochs=2", "--rounds=1", "--batch_size=64",
                        "--allreduce", "--allreduce_sizes=4096", f"--data_dir={data_dir}",
                        f"--workdir={tmp_path}",
                        env=AS_FROM_A_SHELL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not [line for line in result.stderr.splitlines()
                if logs.STARTUP_BANNERS.match(line)], result.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == ["stock:1", "manual:1", "manual:2:ring", "manual:2:ring:bf16",
                          "plain:1:bf16:spe=2:intra=1:inter=1"]
    ceilings, flops = report["matmul_gflops_by_dtype"], report["training_flops_per_example"]
    for row in rows.values():
        assert row["examples_per_sec"] > 0 and row["min"] <= row["examples_per_sec"] <= row["max"]
        # Not bounded by 1: an fp32 row passes the bf16 ceiling where bf16 has no units (0.19x
        # fp32 on a Xeon without avx512_bf16), a bf16 row the fp32 one where it has AMX.
        for dtype, gflops in ceilings.items():
            assert row[f"of_{dtype}_ceiling"] == pytest.approx(
                flops * row["examples_per_sec"] / (gflops * 1e9))
        assert row["flops_fraction"] == row[f"of_{row['precision']}_ceiling"]
        assert row["vs_stock"] > 0
    assert rows["manual:2:ring"]["allreduce"] == "ring"
    assert rows["manual:2:ring"]["speedup"] > 0  # Against manual:1.
    bf16 = rows["manual:2:ring:bf16"]
    assert bf16["precision"] == "bfloat16" and bf16["speedup"] is None  # No manual:1:bf16 row.
    assert bf16["vs_fp32"] == pytest.approx(
        bf16["examples_per_sec"] / rows["manual:2:ring"]["examples_per_sec"])
    assert bf16["vs_plain"] == pytest.approx(
        bf16["examples_per_sec"] / rows["plain:1:bf16:spe=2:intra=1:inter=1"]["examples_per_sec"])
    assert rows["manual:1"]["vs_plain"] is None  # No float32 plain row.
    tuned = rows["plain:1:bf16:spe=2:intra=1:inter=1"]
    assert (tuned["spe"], tuned["intra"], tuned["inter"]) == (2, 1, 1)
    assert report["matmul_gflops"] > 1
    assert set(report["matmul_gflops_by_dtype"]) == {"float32", "bfloat16"}
    assert 13e6 < report["training_flops_per_example"] < 14e6  # LeNet: 3 x 4.5 MFLOP
    timed = {r["algorithm"] for r in report["allreduce"]["rows"]}
    assert {"add_n", "sharded", "ring", "ReductionToOneDevice", "CollectiveAllReduce"} <= timed
    assert all(r["k"] in (2, 3, 4) for r in report["allreduce"]["rows"])
    table = (tmp_path / "bench.md").read_text()
    assert table.count("\n| manual:") == 3 and "| add_n | 2 | 4 KB |" in table
    assert "| bf16 | compiled, 2 steps/call | 1 intra, 1 inter |" in table
    assert (tmp_path / "bench.png").stat().st_size > 1000


def test_bench_refuses_a_malformed_config(tmp_path):
    result = run_module("tfdp.bench", "--configs=manual", f"--workdir={tmp_path}")
    assert result.returncode != 0 and "expected path:devices" in result.stderr


@pytest.mark.cluster
@pytest.mark.root("emulated hosts: network namespaces")
def test_the_allreduce_across_hosts_writes_a_well_formed_table(tmp_path):
    # 3 parameters on 2 workers: sharded sums two of them on worker 0.
    result = run_module("tfdp.bench", "--hosts", "--allreduce", "--configs=", "--workers=2",
                        "--sizes=96KB", "--dtypes=fp32,bf16", "--pieces=3",
                        "--links=1gbit", "--repeats=1", f"--workdir={tmp_path}", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "allreduce_hosts.json").read_text())
    assert [(r["algorithm"], r["dtype"]) for r in rows] == [
        (algorithm, dtype) for dtype in ("float32", "bfloat16")
        for algorithm in ("add_n", "sharded", "ring")] + [
        ("tf_collective_ring", dtype) for dtype in ("float32", "bfloat16")]
    for row in rows:
        # The same 24,000 parameters; in bfloat16 half the bytes travel.
        assert row["workers"] == 2 and row["parameters"] == 24000
        assert row.get("pieces", 3) == 3
        assert row["bytes"] == (96000 if row["dtype"] == "float32" else 48000)
        assert row["link_bits_per_s"] == 1e9 and row["seconds"] > 0
        # 2(k-1)S/B for add_n, 2(k-1)/k S/B for the rings, 2 max((k-1)f, 1-f) S/B for sharded
        # where the busiest worker owns f = 2/3.
        factor = {"add_n": 2, "sharded": 4 / 3}.get(row["algorithm"], 1)
        assert row["predicted_seconds"] == pytest.approx(factor * row["bytes"] * 8 / 1e9)
        # Whoever sends most sends what the arithmetic says, plus headers and set-up.
        assert row["predicted_sent_bytes"] <= row["sent_bytes_per_call"] < 3 * (
            row["predicted_sent_bytes"] + 100e3), row
    sent = {(r["algorithm"], r["dtype"]): r["sent_bytes_per_call"] for r in rows}
    for algorithm in ("add_n", "sharded", "ring", "tf_collective_ring"):
        assert sent[algorithm, "bfloat16"] < 0.75 * sent[algorithm, "float32"], sent
    table = (tmp_path / "allreduce_hosts.md").read_text()
    assert table.splitlines()[0].endswith("; tfdp's gradient in 3 equal parameters"), table
    assert table.count("\n| 1gbit | 2 | 96.0 KB | fp32 | ") == 4, table
    assert table.count("\n| 1gbit | 2 | 48.0 KB | bf16 | ") == 4, table
    assert (tmp_path / "allreduce_hosts.png").stat().st_size > 1000
    assert not left_behind()


def test_the_sharded_prediction_follows_who_owns_most():
    size, rate = 1e6, 8e6  # one second per S
    for k in (2, 3, 4):
        ring = algorithms.seconds("ring", k, size, rate)
        assert algorithms.seconds("sharded", k, size, rate) == pytest.approx(ring)
        assert algorithms.seconds("sharded", k, size, rate, pieces=12) == pytest.approx(ring)
        # One parameter: all of it summed on worker 0, as add_n.
        assert algorithms.seconds("sharded", k, size, rate, pieces=1) == pytest.approx(
            algorithms.seconds("add_n", k, size, rate))
        assert algorithms.sent_bytes("sharded", k, size, pieces=1) == pytest.approx(
            algorithms.sent_bytes("add_n", k, size))
    # 6 parameters on 4 workers: two own 2 (f = 1/3), receiving 3 x 1/3 of S each phase.
    assert algorithms.seconds("sharded", 4, size, rate, pieces=6) == pytest.approx(2.0)
    assert algorithms.sent_bytes("sharded", 4, size, pieces=6) == pytest.approx(
        (1 - 1 / 3 + 3 / 3) * size)


@pytest.mark.cluster
@pytest.mark.root("emulated hosts: network namespaces")
def test_training_across_hosts_writes_the_step_split(tmp_path, data_dir):
    # Real launches of two servers on unshaped and shaped links: the servers' real holdings
    # and the hosts' counted bytes. The rows' arithmetic, every kind of row included, is checked
    # in-process below; the ring launched on emulated hosts runs in the README's command
    # (tests/test_docs.py) and test_remote, multi_worker in test_hosts; manual:2:ring:acc=2 sends
    # half the allreduces, which test_accumulation counts in-process.
    result = run_module("tfdp.bench", "--hosts", "--configs=parameter_server:2:ps=2",
                        "--links=1gbit", "--steps=4", "--batch_size=64", f"--data_dir={data_dir}",
                        f"--workdir={tmp_path}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "training_hosts.json").read_text())
    assert [(r["name"], r["link"]) for r in rows] == [
        ("parameter_server:2:ps=2", link) for link in ("unshaped", "1gbit")]
    assert all(r["sent_bytes_per_epoch"] > 0 and r["step_seconds"] > 0 for r in rows)
    for row in rows:
        assert row["gradient_bytes"] == 516272  # LeNet's parameters in float32.
        # LeNet's W3 and W2 are halved over the two servers: the busiest holds about half.
        assert row["servers"] == 2 and 0.45 * 516272 < row["busiest_server_bytes"] < 0.6 * 516272
    table = (tmp_path / "training_hosts.md").read_text()
    assert table.count("\n| parameter_server:2:ps=2 | ") == 2, table
    assert not left_behind()


def test_the_step_split_across_hosts_is_the_allreduce_and_server_arithmetic(monkeypatch):
    """``measure``'s rows from given examples/s (each launch's, replaced here): compute on
    unshaped links, communication the difference, the predictions of 12.7's arithmetic."""
    from tfdp.bench import host_training
    from tfdp.launcher import emulated_hosts

    speeds = {("manual:1", None): 1000.0, ("manual:1", "1gbit"): 990.0,
              ("manual:2:ring", None): 1600.0,
              ("manual:2:ring", "1gbit"): 1280.0, ("parameter_server:2:ps=2", None): 1200.0,
              ("parameter_server:2:ps=2", "1gbit"): 960.0}
    held = [270000, 246272]

    def launch(config, link, *_):
        return [speeds[(config["name"], link)]] * 2, {"parameter_server_bytes": held}, 1e6

    monkeypatch.setattr(host_training, "_run", launch)
    monkeypatch.setattr(emulated_hosts, "check_available", lambda: None)
    configs = [host_training.parse(name)
               for name in ("manual:1", "manual:2:ring", "parameter_server:2:ps=2")]
    rows = {(r["name"], r["link"]): r
            for r in host_training.measure(configs, ["1gbit"], host_training.Launch(64, 4, 2), 1,
                                             say=lambda _: None)}
    size = host_training.gradient_bytes()
    assert size == 516272
    one = 64 / 1000.0
    for name, k in (("manual:1", 1), ("manual:2:ring", 2)):
        compute = 64 / speeds[(name, None)]
        for link in ("unshaped", "1gbit"):
            row = rows[(name, link)]
            step = 64 / speeds[(name, None if link == "unshaped" else link)]
            assert row["step_seconds"] == pytest.approx(step)
            assert row["compute_seconds"] == pytest.approx(compute)
            assert row["communication_seconds"] == pytest.approx(step - compute)
            # The ring's 2(k-1)/k S/B on a shaped link between two hosts; none on one host.
            predicted = (algorithms.seconds("ring", k, size, 1e9) if link == "1gbit" and k > 1
                         else 0.0)
            assert row["predicted_communication_seconds"] == pytest.approx(predicted)
            assert predicted == 0.0 or predicted == pytest.approx(size * 8 / 1e9)
            # One host's compute shared by k, plus the exchange measured.
            assert row["k_machines_step_seconds"] == pytest.approx(one / k + step - compute)
    for link in ("unshaped", "1gbit"):
        row = rows[("parameter_server:2:ps=2", link)]
        assert row["busiest_server_bytes"] == max(held)
        # min(B / s_max, m B / 2S) steps a second: with m = n = 2, the workers' links bind.
        assert row["predicted_communication_seconds"] == pytest.approx(
            size * 8 / 1e9 if link == "1gbit" else 0.0)


@pytest.mark.parametrize("flags, message", [
    (["--hosts", "--configs=mirrored:2"], "--configs entry 'mirrored:2': with --hosts, expected "
                                          "manual:k"),
    (["--hosts", "--allreduce", "--sizes=big"], "--sizes entry 'big' is not a size like 0.43MB"),
    (["--hosts", "--allreduce", "--configs=", "--workers=1"],
     "--workers=1: give worker counts of 2 or more"),
    (["--hosts", "--allreduce", "--links=fast"], "--links=fast is not a rate like 10mbit"),
    (["--hosts", "--allreduce", "--dtypes=int8"],
     "--dtypes entry 'int8': give float32 or bfloat16"),
    (["--hosts", "--allreduce", "--configs=", "--pieces=0"],
     "--pieces must be a positive integer, got 0"),
    (["--configs=stock:1:bf16"], "--configs entry 'stock:1:bf16': stock is Keras' defaults"),
    (["--configs=mirrored:2:jit"], "mirrored:2:jit: --jit_compile: under tf.distribute"),
    (["--configs=manual:2", "--epochs=1"], "--epochs=1: the first epoch is warm-up"),
    (["--hosts", "--configs=multi_worker:2:acc=2"], "--configs entry 'multi_worker:2:acc=2': "
                                                    "with --hosts, expected manual:k"),
    (["--configs=", "--cadence", "--cadence_configs=loop:1"],
     "--cadence_configs entry 'loop:1': expected mode:batch"),
    (["--configs=", "--cadence", "--cadence_configs=bare:32:sync=4"],
     "--cadence_configs entry 'bare:32:sync=4': sync=N is the loop's")])
def test_the_allreduce_across_hosts_refuses_bad_flags_in_one_line(tmp_path, flags, message):
    result = run_module("tfdp.bench", *flags, f"--workdir={tmp_path}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"tfdp.bench: error: {message}"), \
        result.stderr


@pytest.mark.slow
def test_the_cadence_table_measures_the_bare_step_the_loop_and_no_barrier(tmp_path, data_dir):
    result = run_module("tfdp.bench", "--configs=", "--cadence",
                        "--cadence_configs=bare:8,loop:8:sync=3,ahead:8:acc=2", "--steps=4",
                        "--epochs=2", "--rounds=1", f"--data_dir={data_dir}",
                        f"--workdir={tmp_path}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "cadence.json").read_text())
    assert [r["name"] for r in rows] == ["bare:8", "loop:8:sync=3", "ahead:8:acc=2"]
    for row in rows:
        assert row["step_seconds"] > 0 and row["peak_mb"] > 0, row
        assert len(row["samples"][0]["step_seconds"]) == 1  # The first epoch is not timed.
    bare = rows[0]["step_seconds"]
    assert rows[1]["of_bare"] == pytest.approx(bare / rows[1]["step_seconds"])
    assert rows[2]["of_bare"] is None  # No bare row of its batch and accumulation.
    table = (tmp_path / "cadence.md").read_text()
    assert "\n| loop:8:sync=3 | loop | 8 | 3 | 1 | " in table, table


@pytest.mark.slow
def test_time_to_accuracy_runs_every_seed_as_a_process_and_scores_as_mlperf(tmp_path, data_dir):
    # Two seeds: MLPerf's dropping of the fastest and the slowest of 3 or more is checked
    # in-process (test_mlperf_scores_drop_the_fastest_and_slowest_run_and_need_every_run_to_reach).
    result = run_module("tfdp.bench", "--time_to_accuracy=0.2", "--runs=2",
                        "--tta_configs=manual:2:fast:e=2:eval_flip=false,keras_tuned:1:e=2",
                        "--tta_steps=6",
                        "--tta_eval_examples=1024", f"--data_dir={data_dir}",
                        f"--workdir={tmp_path}", env=AS_FROM_A_SHELL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not [line for line in result.stderr.splitlines()
                if logs.STARTUP_BANNERS.match(line)], result.stderr[-3000:]
    report = json.loads((tmp_path / "time_to_accuracy.json").read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == ["manual:2:fast:e=2:eval_flip=false", "keras_tuned:1:e=2"]
    batches = {"manual:2:fast:e=2:eval_flip=false": RECIPES["fast"]["batch_size"],
               "keras_tuned:1:e=2": references.BATCH["tuned"]}
    ceilings = report["matmul_gflops"]
    for name, row in rows.items():
        assert [run["seed"] for run in row["runs"]] == [1, 2]
        for run in row["runs"]:
            clock, accuracy = zip(*run["curve"])
            assert list(clock) == sorted(clock) and clock[0] > 0
            first = next((i for i, a in enumerate(accuracy) if a >= 0.2), None)
            assert run["epochs"] == (None if first is None else first + 1)
            assert run["seconds"] == (None if first is None else clock[first])
            # The examples trained to the target: the --tta_steps=6 steps of each epoch.
            assert run["examples"] == (None if first is None else
                                       run["epochs"] * 6 * batches[name]), run
            assert run["examples_per_sec"] > 0
        assert row["score_s"] == tta.mlperf_mean([run["seconds"] for run in row["runs"]])
        if row["examples"]:  # The arithmetic floor: at the ceiling of the run's precision.
            assert row["floor_s"] == pytest.approx(
                row["examples"] * row["flops_per_example"] / (ceilings[row["precision"]] * 1e9))
            assert row["flops_per_example"] == pytest.approx(13.5e6, rel=0.01)  # LeNet's.
        if row["score_s"]:
            assert row["of_floor"] == pytest.approx(row["score_s"] / row["floor_s"])
    assert any(run["seconds"] for row in rows.values() for run in row["runs"])
    curves = [tuple(run["curve"]) for run in rows["manual:2:fast:e=2:eval_flip=false"]["runs"]]
    assert len({tuple(a for _, a in c) for c in curves}) > 1  # Seeds differ.
    table = (tmp_path / "time_to_accuracy.md").read_text()
    assert table.count("\n| manual:2:fast:e=2:eval_flip=false | fast | ") == 1
    assert "| keras_tuned:1:e=2 | - |" in table
    assert (tmp_path / "time_to_accuracy.png").stat().st_size > 1000


def test_the_table_holds_the_fast_step_against_the_textbook_step_of_its_path():
    def row(name, recipe, rate, path="manual", flags=None):
        return {"name": name, "path": path, "devices": 2 if path == "manual" else 1,
                "recipe": recipe, "train_flags": flags or {}, "target": 0.9, "runs": [{}],
                "reached": 0, "score_s": None, "min_s": None, "median_epochs": None,
                "examples": None, "examples_per_sec": rate, "startup_s": 1.0}

    rows = [row("manual:2:fast", "fast", 9000.0), row("manual:2:textbook:e=2", "textbook", 10000.0),
            row("manual:2:fast:batch_size=64", "fast", 1.0, flags={"batch_size": "64"}),
            row("keras_tuned:1", "-", 5000.0, path="keras_tuned")]
    assert tta.step_pairs(rows) == [(rows[0], rows[1])]
    assert ("The fast step on manual:2: 0.90x the textbook step's examples/s (9000 against "
            "10000" in tta.format_rows(rows))


def test_the_keras_references_build_as_written():
    """Both scripts' models compile as a user's would (their runs: the bench's test above)."""
    import keras

    for reference, one_hot in (("beginner", False), ("tuned", True)):
        net, labels_one_hot = references.compiled(reference, steps=100)
        assert labels_one_hot == one_hot
        assert net.count_params() > 0
    tuned = references.compiled("tuned", steps=100)[0]
    assert isinstance(tuned.optimizer, keras.optimizers.SGD) and tuned.optimizer.nesterov
    rate = references.one_cycle(100)  # 0.04, up to 0.4 at a quarter, down to 0.
    assert [round(float(rate(step)), 4) for step in (0, 25, 100)] == [0.04, 0.4, 0.0]


def test_a_configuration_passes_any_other_train_flag_for_an_ablation():
    config = tta.parse("mirrored:2:fast:e=4:label_smoothing=0:batch_size=256")
    settings = SimpleNamespace(data_dir=None, manual_dir=None, tta_steps=None,
                               tta_eval_examples=1024)
    command = tta.command(config, "/w", 0.9, 2, settings)
    assert command[command.index("-m") + 1] == "tfdp.train"
    assert {"--strategy=mirrored", "--recipe=fast", "--epochs=4", "--label_smoothing=0",
            "--batch_size=256", "--eval_steps=4"} <= set(command), command
    # Without e=N, the run is the recipe's whole configuration, its length too: what
    # `python -m tfdp.train --recipe=fast` trains.
    command = tta.command(tta.parse("manual:2:fast"), "/w", 0.9, 2, settings)
    assert not [arg for arg in command if arg.startswith("--epochs")], command
    assert Config(recipe="fast").epochs == RECIPES["fast"]["epochs"]
    assert Config().epochs == 10


def test_mlperf_scores_drop_the_fastest_and_slowest_run_and_need_every_run_to_reach():
    assert tta.mlperf_mean([30.0, 10.0, 20.0, 50.0, 40.0]) == 30.0
    assert tta.mlperf_mean([12.0, 10.0]) == 11.0
    assert tta.mlperf_mean([12.0, None, 10.0]) is None


@pytest.mark.parametrize("flags, message", [
    (["--time_to_accuracy=1.5"], "--time_to_accuracy must be a fraction in (0, 1], got 1.5"),
    (["--time_to_accuracy=0.9", "--tta_configs=beginner:2"], "run on 1 device"),
    (["--time_to_accuracy=0.9", "--tta_configs=manual:2:fastest"], "unknown option 'fastest'"),
    (["--time_to_accuracy=0.9", "--runs=0"], "--runs must be a positive integer, got 0"),
    (["--time_to_accuracy=0.9", "--tta_configs=manual:2:seed=3"], "sets --seed itself"),
    (["--time_to_accuracy=0.9", "--tta_configs=beginner:1:lr=1"], "unknown option 'lr=1'"),
    (["--time_to_accuracy=0.9", "--tta_configs=plain:2"], "plain:2: --strategy=plain trains on "
                                                          "one device"),
])
def test_time_to_accuracy_refuses_bad_flags_in_one_line(tmp_path, flags, message):
    result = run_module("tfdp.bench", *flags, f"--workdir={tmp_path}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("tfdp.bench: error: ") and message in lines[0]


def test_every_configuration_is_checked_as_tfdp_train_would_before_any_run():
    from tfdp.bench.configs import check_command, parse_config, train_command

    settings = SimpleNamespace(model="lenet", batch_size=64, epochs=2, steps=3, data="real",
                               data_dir=None, manual_dir=None, tta_steps=None,
                               tta_eval_examples=None)
    for name in ("stock:1", "plain:1:jit", "manual:2:ring:jit", "multi_worker:2:bf16",
                 "mirrored:2:backup=5", "manual:2:backup=30s"):
        check_command(name, train_command(parse_config(name), "/w", settings))
    assert "--backup_every=5" in train_command(parse_config("mirrored:2:backup=5"), "/w",
                                               settings)
    with pytest.raises(UserError, match=r"^--configs entry 'manual:2:backup=1\.5': backup=1\.5: "
                                        r"give steps"):
        parse_config("manual:2:backup=1.5")
    for name in tta.DEFAULT_CONFIGS.split(","):
        check_command(name, tta.command(tta.parse(name), "/w", 0.9, 1, settings))
    for name, refusal in (("parameter_server:2:jit", "--jit_compile: the coordinator"),
                          ("multi_worker:2:jit", "--jit_compile: under tf.distribute")):
        with pytest.raises(UserError, match=f"^{name}: {refusal}"):
            check_command(name, train_command(parse_config(name), "/w", settings))
    with pytest.raises(UserError, match="^manual:2:batch_size=x: .*batch_size"):
        check_command("manual:2:batch_size=x", tta.command(
            tta.parse("manual:2:batch_size=x"), "/w", 0.9, 1, settings))


def test_the_bench_trains_your_model_on_every_configuration_stock_fit_included(tmp_path):
    """--model takes your model's spec: every configuration's command trains it (Keras' stock
    fit too), and its FLOPs per example are counted from its own layers."""
    from types import SimpleNamespace

    from shared_runs import YOURS
    from tfdp.bench.configs import parse_config, train_command, training_flops_per_example

    settings = SimpleNamespace(model=YOURS, batch_size=64, epochs=2, steps=3, data="real",
                               data_dir=None, manual_dir=None)
    for name in ("stock:1", "plain:1", "manual:2", "mirrored:2", "multi_worker:2"):
        assert f"--model={YOURS}" in train_command(parse_config(name), str(tmp_path), settings)
    # Its two 3x3 convolutions (1 -> 8, 8 -> 8 channels) on 28 x 28, its dense 392 -> 10.
    forward = 28 * 28 * 8 * 9 * 1 + 28 * 28 * 8 * 9 * 8 + 392 * 10
    assert training_flops_per_example(YOURS) == 3 * 2 * forward
    bad = run_module("tfdp.bench", "--model=nowhere", f"--workdir={tmp_path}")
    assert bad.stderr.strip().splitlines()[-1].startswith("tfdp.bench: error: --model=nowhere: ")
