"""Nothing trained is lost and nothing bad is exported: divergence, damaged starting weights,
shared and damaged run folders and backups, full disks, partial exports and read-only folders,
each ending in a resumable state or a one-line error, never a traceback or a lost model."""

import json
import os
import re
import signal
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO
from processes import child_env, run_train, train_command, wait_for
from tfdp.config.settings import Config
from tfdp.export import saved_model
from tfdp.models import lenet
from tfdp.training import entry
from tfdp.training import divergence, report, run_folder
from tfdp.training.backups import Backups, identity
from tfdp.training.state import TrainingState
from tfdp.util.errors import Diverged, UserError


needs_root = pytest.mark.root("mounts a small tmpfs and read-only folders")


def served_logits(version, images):
    return tf.saved_model.load(str(version)).signatures["serving_default"](
        images=tf.constant(images))["logits"].numpy()


# --- Losing work ---------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["manual", "mirrored"])
@pytest.mark.slow
def test_a_runaway_loss_stops_the_run_and_exports_nothing(tmp_path, data_dir, strategy):
    """--lr=50: the loss runs away (finite under mirrored: 2.1e29 as an epoch's mean, the model
    at chance), and the run stops within the first steps, naming the step, exporting nothing."""
    result = subprocess.run(
        train_command(data_dir, tmp_path, f"--strategy={strategy}", "--num_gpus=2", "--lr=50",
                      "--epochs=3", "--steps_per_epoch=30", "--eval_steps=1"),
        capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=300)
    assert result.returncode == 1
    at = "at" if strategy == "manual" else "by"
    assert re.search(rf"^tfdp\.train: error: the training loss is \S+ {at} epoch 1, step \d+/30(, "
                     r"over 100 times its first value and chance's \(2\.\d\d\))?: training "
                     r"diverged, nothing was exported; try a smaller --lr$",
                     result.stderr, re.M), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "export").exists() or not os.listdir(tmp_path / "export")


def test_divergence_is_a_non_finite_or_exploded_loss_and_never_a_healthy_one():
    watch = divergence.Divergence()
    for step, loss in enumerate([2.31, 2.9, 1.2, 0.4, 229.0], start=1):  # Noisy, not exploded.
        watch.check(loss, step, 235)
    with pytest.raises(Diverged, match=r"the training loss is 232 at epoch 1, step 6/235, over "
                                       r"100 times its first value and chance's \(2\.31\)"):
        watch.check(232.0, 6, 235)
    with pytest.raises(Diverged, match=r"the training loss is nan at epoch 2, step 1/235: "):
        divergence.Divergence().check(float("nan"), 236, 235)
    resumed = divergence.Divergence()  # A trained model's first loss: chance still sets the bar.
    resumed.check(0.3, 1000, 235)
    resumed.check(200.0, 1001, 235)
    with pytest.raises(Diverged, match=r"by epoch 5, step 60/235, over 100 times .* \(2\.30\)"):
        resumed.check(231.0, 1000, 235, exact=False)


def test_keras_path_stops_at_a_non_finite_loss_too(tmp_path, data_dir):
    config = Config(strategy="mirrored", num_gpus=2, lr=1000.0, epochs=2, steps_per_epoch=30,
                    eval_steps=1, data_dir=data_dir, workdir=str(tmp_path / "run"),
                    export_dir=str(tmp_path / "export"))
    with pytest.raises(Diverged, match=r"by epoch 1, step \d+/30: training diverged"):
        entry.train(config)
    assert not (tmp_path / "export").exists() or not os.listdir(tmp_path / "export")


def write_init(path, **changes):
    params = dict(lenet.init_params(0), **changes)
    np.savez(path, **params)
    return str(path)


def test_init_files_that_cannot_be_lenet_are_refused_in_one_line(tmp_path):
    nan = lenet.init_params(0)["W2"].copy()
    nan[0, 0, 0, 0] = np.nan
    cases = {
        write_init(tmp_path / "nan.npz", W2=nan): "W2 holds NaN or infinite values",
        str(tmp_path / "text.npz"): "not a zip archive",
        str(tmp_path / "array.npz"): "a single .npy array renamed",
        str(tmp_path / "partial.npz"): "it lacks b3, W4",
    }
    (tmp_path / "text.npz").write_text("W1 = 0.1\n")
    np.save(tmp_path / "array.npy", np.zeros(3))
    os.rename(tmp_path / "array.npy", tmp_path / "array.npz")
    partial = lenet.init_params(0)
    del partial["b3"], partial["W4"]
    np.savez(tmp_path / "partial.npz", **partial)
    for path, message in cases.items():
        with pytest.raises(UserError, match=re.escape(message)) as caught:
            lenet.start_params(path, 0)
        assert str(caught.value).startswith(f"--init={path}")
        assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_a_run_folder_belongs_to_one_run_at_a_time(tmp_path, data_dir):
    first = subprocess.Popen(train_command(data_dir, tmp_path, "--epochs=5"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=child_env(), cwd=REPO)
    try:
        wait_for(lambda: (tmp_path / "run" / ".lock-worker-0").exists(), 120, "the first run")
        time.sleep(0.5)
        second = subprocess.run(train_command(data_dir, tmp_path, "--epochs=5"),
                                capture_output=True, text=True, env=child_env(), cwd=REPO,
                                timeout=120)
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert second.returncode == 1
    assert second.stderr.strip().splitlines()[-1] == (
        f"tfdp.train: error: --workdir={tmp_path / 'run'} is in use by another run "
        f"(pid {first.pid}): wait for it to end, or give this run its own --workdir")
    with run_folder.claim(str(tmp_path / "run")):  # Free again once the first has gone.
        pass


def test_a_run_folder_on_a_volume_without_locks_is_used_with_a_warning(tmp_path, monkeypatch):
    """A shared volume whose flock fails (ENOLCK: NFS mounted nolock, some Kubernetes volumes)
    trains as well, warning that nothing refuses a second run; any other error is one line."""
    import errno

    def no_locks(path, wait=True):
        raise OSError(errno.ENOLCK, "No locks available")

    warned = []
    monkeypatch.setattr(run_folder, "locked", no_locks)
    monkeypatch.setattr(run_folder.logger, "warning", lambda line, *args: warned.append(
        line % args))
    with run_folder.claim(str(tmp_path / "run")):
        (tmp_path / "run" / "metrics.json").write_text("{}")
    assert warned == [f"--workdir={tmp_path / 'run'} is on a file system without locks "
                               "(No locks available): nothing refuses a second run given the "
                               "same --workdir while this one runs"]
    monkeypatch.setattr(run_folder, "locked", lambda path, wait=True: os.open("/", os.O_WRONLY))
    with pytest.raises(UserError, match=r"is not writable \(Is a directory\)"):
        with run_folder.claim(str(tmp_path / "other")):
            pass


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


@pytest.mark.slow
@needs_root
def test_full_disks_are_one_line_errors_and_finished_training_is_never_lost(tmp_path, data_dir):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", str(small)], check=True)
    try:
        # A full --workdir under mirrored: the second backup does not fit.
        command = [sys.executable, "-m", "tfdp.train", "--strategy=mirrored", "--num_gpus=2",
                   "--epochs=3", "--steps_per_epoch=5", "--eval_steps=1",
                   f"--data_dir={data_dir}", f"--workdir={small / 'run'}",
                   f"--export_dir={tmp_path / 'export'}"]
        full = run_train(command)
        assert full.returncode == 1, full.stderr[-3000:]
        assert full.stderr.strip().splitlines()[-1] == (
            f"tfdp.train: error: cannot write the backup of step 10 in "
            f"{small / 'run' / 'backup' / 'worker-0'} (no space left on the device); the backup "
            "of step 5 is kept: make room and run the same command again")
        assert not [n for n in os.listdir(small / "run" / "backup" / "worker-0")
                    if n.endswith(".tmp")]
        subprocess.run(["mount", "-o", "remount,size=8m", str(small)], check=True)
        rerun = run_train(command)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "resuming at epoch 2/3, step 0/5 (global step 5)" in rerun.stdout

        # A full --export_dir: training ends, the export fails in one line, the backup stays,
        # and with room the same command only exports. The mount shrinks below an export, and
        # tmpfs refuses to shrink below what it holds: the run above is done with.
        shutil.rmtree(small / "run")
        subprocess.run(["mount", "-o", "remount,size=100k", str(small)], check=True)
        # With a validation split: the test set's figures, evaluated once after training, are
        # the resumed run's too.
        command = [sys.executable, "-m", "tfdp.train", "--epochs=2", "--steps_per_epoch=5",
                   "--eval_steps=1", "--validation_split=0.1", f"--data_dir={data_dir}",
                   f"--workdir={tmp_path / 'run'}", f"--export_dir={small / 'export'}"]
        full = run_train(command)
        assert full.returncode == 1, full.stderr[-3000:]
        assert full.stderr.strip().splitlines()[-1] == (
            f"tfdp.train: error: cannot write the export under {small / 'export'} (No space "
            f"left on device): the trained weights are kept in "
            f"{tmp_path / 'run' / 'backup' / 'worker-0'}; make room and run the same command "
            "again to export")
        assert os.listdir(small / "export") == []  # No version, and no partial one.
        trained = json.loads((tmp_path / "run" / "metrics.json").read_text())
        subprocess.run(["mount", "-o", "remount,size=8m", str(small)], check=True)
        rerun = run_train(command)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "resuming a run that finished training (10 steps): exporting it" in rerun.stdout
        assert "epoch 2/2: loss" not in rerun.stdout
        assert os.listdir(small / "export") == ["1"]
        exported = json.loads((tmp_path / "run" / "metrics.json").read_text())
        assert exported["test"] == trained["test"] and "acc" in trained["test"]
        assert exported["confusion"] == trained["confusion"]
        assert (f"test acc (first 256 of 10000 test examples): {trained['test']['acc']:.2f}, "
                in rerun.stdout)
        assert exported["mistakes"]["split"] == "test"
    finally:
        subprocess.run(["umount", str(small)], check=False)


@needs_root
def test_a_full_disk_while_preparing_the_data_is_one_line_and_leaves_nothing(tmp_path,
                                                                           manual_dir):
    """--manual_dir given, the --data_dir on a disk too small for TFDS' records: the line says
    the disk is full (not to pass --manual_dir), and no partial preparation or lock stays."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], check=True)
    try:
        result = run_train(train_command(small, tmp_path, "--epochs=1", "--steps_per_epoch=1",
                                         f"--manual_dir={manual_dir}"))
        assert result.returncode == 1, result.stderr[-3000:]
        assert result.stderr.strip().splitlines()[-1] == (
            f"tfdp.train: error: could not prepare fashion_mnist in {small}: no space left on "
            "the device; make room (it needs about 100 MB) or give another --data_dir, and run "
            "again"), result.stderr[-3000:]
        left = [os.path.join(folder, name) for folder, dirs, names in os.walk(small)
                for name in dirs + names]
        assert not [p for p in left if ".incomplete" in p or p.endswith(".lock")], left
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_stale_partial_exports_are_removed_and_live_ones_kept(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = socket.gethostname()
    stale = tmp_path / f".partial-{host}-{gone.pid}-abc123"
    live = tmp_path / f".partial-{host}-{os.getpid()}-def456"
    other_host = tmp_path / f".partial-elsewhere-{gone.pid}-ghi789"
    for folder in (stale, live, other_host):
        (folder / "variables").mkdir(parents=True)
    assert saved_model.remove_stale_partials(str(tmp_path)) == [stale.name]
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, other_host.name])


@needs_root
def test_a_read_only_prepared_data_dir_trains_and_a_missing_one_says_so(tmp_path, data_dir,
                                                                       manual_dir):
    from tfdp.data import pipeline, fashion_mnist, tfds

    copy = tmp_path / "data"
    subprocess.run(["cp", "-r", data_dir, str(copy)], check=True)
    # As prepared by TFDS, without tfdp's .npy cache.
    subprocess.run(["rm", "-r", str(copy / "tfdp-datasets")], check=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (copy, empty):
        subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
    try:
        split = pipeline.load_split("test", str(copy))
        assert len(split.labels) == 10000
        with pytest.raises(UserError, match=r"is not prepared in .*, and it cannot be prepared "
                                            r"there \(Read-only file system\)"):
            tfds.prepare(fashion_mnist.DATASET, str(empty), manual_dir)
    finally:
        for folder in (copy, empty):
            subprocess.run(["umount", str(folder)], check=False)


@needs_root
def test_a_read_only_run_folder_is_one_line_naming_the_flag(tmp_path, data_dir):
    folder = tmp_path / "read-only"
    folder.mkdir()
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
    try:
        for workdir in (folder, folder / "new"):  # The folder itself, or one to create in it.
            config = Config(data_dir=data_dir, workdir=str(workdir),
                            export_dir=str(tmp_path / "export"))
            with pytest.raises(UserError, match=rf"^--workdir={workdir} is not writable "
                                                r"\(Read-only file system\): give a --workdir you "
                                                "can write to$"):
                entry.train(config)
    finally:
        subprocess.run(["umount", str(folder)], check=False)


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
