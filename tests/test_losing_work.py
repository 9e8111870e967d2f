"""Nothing trained is lost: shared run folders, full disks, partial exports and read-only
folders, each ending in a resumable state or a one-line error, never a traceback or a lost
model. (Divergence and damaged starting weights: test_divergence.py; backups: test_backups.py.)"""

import json
import os
import signal
import shutil
import socket
import subprocess
import sys
import time

import pytest
import zygote

from conftest import REPO
from processes import child_env, run_train, train_command, wait_for
from tfdp.config.settings import Config
from tfdp.export import saved_model
from tfdp.training import entry, run_folder
from tfdp.util.errors import UserError


needs_root = pytest.mark.root("mounts a small tmpfs and read-only folders")


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
    holder = zygote.running_pid(first.pid)  # The process that runs the command (forked or not).
    assert second.stderr.strip().splitlines()[-1] == (
        f"tfdp.train: error: --workdir={tmp_path / 'run'} is in use by another run "
        f"(pid {holder}): wait for it to end, or give this run its own --workdir")
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
