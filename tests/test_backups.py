"""Backups a run resumes from: refused under other flags, a damaged newest one passed over for
the newest intact one, the last one written after the test set's figures, within an epoch by
steps or time (``--backup_every``), and written behind training with a failure raised after."""

import json
import os

import numpy as np
import pytest

from tfdp.config.settings import Config
from tfdp.models import lenet
from tfdp.training import entry, report
from tfdp.training.backups import Backups, identity
from tfdp.training.state import TrainingState
from tfdp.util.errors import UserError


def manual_config(tmp_path, data_dir, **overrides):
    settings = dict(num_gpus=2, epochs=3, steps_per_epoch=5, eval_steps=1, batch_size=64,
                    data_dir=data_dir, workdir=str(tmp_path / "run"),
                    export_dir=str(tmp_path / "export"))
    return Config(**dict(settings, **overrides))


def test_a_resume_under_other_flags_is_refused_naming_them(tmp_path, data_dir):
    earlier = manual_config(tmp_path, data_dir)
    backups = Backups(earlier.workdir, 0, identity(earlier))
    backups.save(5, TrainingState(lenet.to_keras_weights(lenet.init_params(0))))
    with pytest.raises(UserError) as caught:
        entry.train(manual_config(tmp_path, data_dir, lr=0.1, seed=1, batch_size=32))
    assert str(caught.value) == (
        f"{tmp_path / 'run'} holds a run trained with --batch_size=64 --lr=0.2 --seed=0; this "
        "command has --batch_size=32 --lr=0.1 --seed=1: run it with the same flags to resume, "
        "or give it another --workdir")


def test_a_damaged_newest_backup_falls_back_to_the_newest_intact_one(tmp_path, data_dir, capsys,
                                                                    caplog):
    config = manual_config(tmp_path, data_dir)
    backups = Backups(config.workdir, 0, identity(config))
    weights = TrainingState(lenet.to_keras_weights(lenet.init_params(0, init="glorot")))
    backups.save(5, weights)
    newest = backups.save(10, weights)
    with open(newest, "r+b") as f:  # Truncated, as by a crash of the disk or the copy.
        f.truncate(os.path.getsize(newest) // 2)
    metrics = os.path.join(config.workdir, "metrics.json")
    with open(metrics, "w") as f:  # The earlier epochs' record, damaged too.
        f.write('{"epochs": [{"epo')
    result = entry.train(config)
    out = capsys.readouterr().out
    # tfdp's own: TensorFlow warns of retracing by what earlier tests in this process traced.
    warnings = [r.getMessage() for r in caplog.records
                if r.levelname == "WARNING" and r.name.split(".")[0] == "tfdp"]
    assert warnings[0] == (f"the backup {newest} is damaged (BadZipFile: File is not a zip "
                           "file); the backup of step 5 is intact")
    assert warnings[1].startswith(f"cannot read the earlier epochs from {metrics} (")
    assert len(warnings) == 2, warnings
    assert "resuming at epoch 2/3, step 0/5 (global step 5)" in out
    assert [r["epoch"] for r in result.history] == [2, 3]  # No metrics.json of epoch 1 here.


def test_a_run_stopped_while_it_evaluates_the_test_set_evaluates_it_again_on_resuming(
        tmp_path, data_dir, monkeypatch, capsys):
    """A stop while the test set is evaluated once after training (a validation split after
    every epoch) comes before the last backup: the same command trains the last epoch again
    and reports the test set, rather than finding the run finished with no test figure."""
    config = manual_config(tmp_path, data_dir, epochs=2, validation_split=0.1)

    class Stopped(Exception):
        pass

    def stopped(*args, **kwargs):
        raise Stopped("as by SIGKILL while the test set was evaluated")

    monkeypatch.setattr(report.Reporter, "tested", stopped)
    with pytest.raises(Stopped):
        entry.train(config)
    monkeypatch.undo()
    assert Backups(config.workdir, 0, identity(config)).steps() == [5]  # Not the last step.
    capsys.readouterr()
    result = entry.train(config)
    out = capsys.readouterr().out
    assert "resuming at epoch 2/2, step 0/5 (global step 5)" in out
    assert "test set, evaluated once after training" in out
    recorded = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert recorded["test"]["acc"] == result.test_accuracy


def test_backup_every_counts_steps_or_time_and_bad_values_are_one_line(monkeypatch):
    """--backup_every: steps, or seconds since the last backup (an epoch's end counts), or 0
    (never within an epoch); a backup at the step the count started from is never due."""
    from tfdp.training import backup_interval

    steps = backup_interval.BackupInterval("8", first_step=5)
    assert [k for k in range(5, 30) if steps.due(k)] == list(range(13, 30))
    steps.saved(13)
    assert not steps.due(20) and steps.due(21)
    now = [100.0]
    monkeypatch.setattr(backup_interval.time, "monotonic", lambda: now[0])
    timed = backup_interval.BackupInterval("1.5m")
    now[0] += 89
    assert not timed.due(7)
    now[0] += 1
    assert timed.due(7) and not timed.due(0)
    timed.saved(7)
    assert not timed.due(8)
    assert not any(backup_interval.BackupInterval("0").due(k) for k in range(1, 10 ** 6, 997))
    for bad in ("1.5", "-3", "ten", "5 min"):
        with pytest.raises(UserError, match=rf"^--backup_every={bad}: give steps \(500\), a time "
                                            r"\(90s, 10m, 2h\) or 0 \(only at epochs' ends"):
            Config(backup_every=bad)


def test_a_backup_written_behind_holds_its_step_and_a_failure_is_raised_after(tmp_path,
                                                                              monkeypatch):
    """The arrays are copied at the step (training changes them on), written by a thread; the
    next save waits for it; a write that fails (a full disk) is the next save's one-line
    error, naming the backup kept."""
    import errno

    from tfdp.training import backups as backups_module

    backups = Backups(str(tmp_path), 0, {"lr": 0.1})
    weights = [np.arange(6.0).reshape(2, 3)]
    path = backups.save_behind(3, TrainingState(weights))
    weights[0] += 100  # The next step, while the thread may still write.
    backups.wait()
    assert os.path.basename(path) == "step-3.npz" and backups.steps() == [3]
    assert np.array_equal(backups.load(3).weights[0], np.arange(6.0).reshape(2, 3))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(backups_module.files, "write_atomic", full)
    backups.save_behind(4, TrainingState(weights))  # Training goes on: raised later.
    with pytest.raises(UserError, match=r"^cannot write the backup of step 4 in .* \(no space "
                                        r"left on the device\); the backup of step 3 is kept"):
        backups.save(5, TrainingState(weights))
