"""A path declared in one module (``tests/toy_path.py``) is taken by everything that chooses
paths, with no other file edited: the flags and their checks, ``--help``, the launcher, Slurm's
roles, the bench and ``tfdp.run``."""

import dataclasses
import os
import sys

import pytest

from processes import run_module
from tfdp import paths
from tfdp.config.settings import Config
from tfdp.util.errors import UserError

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def toy():
    """``--strategy=toy`` registered for one test, then forgotten."""
    sys.path.insert(0, TESTS)
    import toy_path

    paths.register(toy_path.TOY)
    yield toy_path.TOY
    paths.unregister("toy")
    sys.path.remove(TESTS)


def test_the_flags_take_the_toy_path_its_defaults_and_its_refusals(toy):
    config = Config(strategy="toy")
    assert config.initializer == "textbook" and config.steps_between_syncs == 1
    assert Config(strategy="toy", steps_per_execution=4).steps_per_execution == 4
    with pytest.raises(UserError, match=r"^--num_gpus=2: --strategy=toy trains on one device$"):
        Config(strategy="toy", num_gpus=2)
    with pytest.raises(UserError, match=r"^--model=lenet_bn: a toy; --strategy=toy trains "
                                        r"lenet: use --strategy=manual, mirrored"):
        Config(strategy="toy", model="lenet_bn")
    with pytest.raises(UserError, match=r"^--bucket_kb=8 is --strategy=manual's \(the buckets "
                                        r"of its own allreduce\): --strategy=toy exchanges"):
        Config(strategy="toy", bucket_kb=8)
    paths.unregister("toy")
    with pytest.raises(UserError, match=r"^--strategy=toy is not one of: manual, mirrored, "
                                        r"multi_worker, plain, parameter_server$"):
        Config(strategy="toy")


def test_a_path_owned_flag_is_declared_by_its_path_help_choices_and_default():
    """The flags a path owns take their help and choices from its description, and their
    default is the first value that leaves them unused there."""
    from tfdp.config.settings import help_of
    from tfdp.paths.manual import algorithms

    fields = {f.name: f for f in dataclasses.fields(Config)}
    for path in paths.all_paths():
        for flag, own in path.own_flags.items():
            assert fields[flag].default == own.off[0], flag
            assert help_of(fields[flag]).startswith(f"{path.name} only: "), flag
    assert all(f"{name} (" in help_of(fields["allreduce"]) for name in algorithms.NAMES)
    with pytest.raises(UserError, match=r"^--allreduce=tree is not one of: add_n, sharded, "
                                        r"ring$"):
        Config(allreduce="tree")


def test_help_lists_a_path_named_in_tfdp_paths():
    shown = run_module("tfdp.train", "--help",
                       env={"TFDP_PATHS": "toy_path",
                            "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH",
                                                                                  "")])})
    assert shown.returncode == 0, shown.stderr
    assert "toy: the tests' toy path (Keras fit, one device)" in " ".join(shown.stdout.split())
    missing = run_module("tfdp.train", "--strategy=toy", env={"TFDP_PATHS": "no_such_module"})
    assert missing.stderr.strip().splitlines()[-1] == (
        "tfdp.train: error: $TFDP_PATHS names no_such_module, which cannot be imported (No "
        "module named 'no_such_module')")


def test_the_launcher_and_slurm_make_the_toy_paths_cluster(toy):
    from tfdp.cluster import tf_config
    from tfdp.launcher import local_cluster, processes

    toy_config = Config(strategy="toy")
    assert local_cluster._check((2, 2), False, None, toy_config) == ""
    specs = processes.processes(toy_config, 2, ["--strategy=toy"], ["a:1", "b:2"], None,
                                    "s", False)
    assert [s.role for s in specs] == ["worker 0", "worker 1"]
    assert all(s.argv[1:3] == ["-m", "tfdp.train"] for s in specs)
    assert tf_config.roles("toy", 3, 1) == [("worker", 0), ("worker", 1), ("worker", 2)]
    assert "--strategy=manual, multi_worker, parameter_server or toy clusters" in (
        local_cluster._check((2, 2), False, None, Config(strategy="plain")))


def test_the_bench_runs_the_toy_path(toy):
    from tfdp.bench import configs, host_training
    from tfdp.bench import time_to_accuracy as tta

    config = configs.parse_config("toy:2")
    assert config["allreduce"] == "-"
    command = configs.train_command(config, "/w", _Settings())
    assert command[1:5] == ["-m", "tfdp.launch", "--num_workers=2", "--"]
    assert "--strategy=toy" in command
    assert tta.parse("toy:1:fast")["path"] == "toy"
    assert host_training.parse("toy:2")["workers"] == 2
    with pytest.raises(ValueError, match="has no allreduce of its own"):
        configs.parse_config("toy:2:ring")


class _Settings:
    model, batch_size, epochs, steps, data, data_dir, manual_dir = (
        "lenet", 64, 2, 3, "real", None, None)


def test_tfdp_run_trains_on_the_toy_path(toy, tmp_path, data_dir):
    import tfdp

    result = tfdp.run(strategy="toy", epochs=1, steps_per_epoch=3, eval_steps=1,
                      batch_size=32, data_dir=data_dir, workdir=str(tmp_path / "run"),
                      export_dir=str(tmp_path / "export"))
    assert [record["epoch"] for record in result.history] == [1]
    assert result.export_path and os.path.isdir(result.export_path)
