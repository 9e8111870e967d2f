"""Faults handled like a production system: preemption (real SIGTERM from outside), kills,
hangs, divergence, shared and damaged run folders, full disks, and bad input, each ending in a
resumable state or a one-line error, never a traceback, a hang or a lost model."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import (REPO, ROOT, Terminal, child_env, children, launch, run_module,
                      tf_config_of)
from tfdp.cluster import tf_config
from tfdp.launcher.local_cluster import free_ports
from tfdp.config import Config
from tfdp.errors import PREEMPTED_EXIT_CODE, Diverged, Preempted, UserError
from tfdp.models import lenet
from tfdp import files
from tfdp import paths
from tfdp.training import divergence, export, preemption, run_folder
from tfdp.training.backups import Backups, identity

needs_root = pytest.mark.root("mounts a small tmpfs and read-only folders")


def train_command(data_dir, folder, *flags):
    return [sys.executable, "-m", "tfdp.train", f"--data_dir={data_dir}",
            f"--workdir={folder / 'run'}", f"--export_dir={folder / 'export'}", *flags]


def run_train(command):
    return subprocess.run(command, capture_output=True, text=True, env=child_env(), cwd=REPO,
                          timeout=300)


def wait_for(predicate, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def served_logits(version, images):
    return tf.saved_model.load(str(version)).signatures["serving_default"](
        images=tf.constant(images))["logits"].numpy()


# --- Preemption ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["manual", "mirrored"])
def test_sigterm_preempts_mid_epoch_and_the_same_command_resumes_to_the_same_model(
        tmp_path, data_dir, test_split, strategy):
    flags = [f"--strategy={strategy}", "--num_gpus=2", "--epochs=2", "--steps_per_epoch=200",
             "--batch_size=64", "--eval_steps=1", "--init=glorot"]
    command = train_command(data_dir, tmp_path, *flags)
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=child_env(), cwd=REPO)
    backups = Backups(str(tmp_path / "run"), 0, {})
    wait_for(lambda: 200 in backups.steps() or run.poll() is not None, 240, "the first epoch")
    time.sleep(0.3)  # Into the second epoch.
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=60)
    assert run.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    stopped = re.search(r"^tfdp\.train: preempted \(SIGTERM\) at step (\d+): state of step \1 "
                        r"saved in .*step-\1\.npz; run the same command again to resume$",
                        err, re.M)
    assert stopped, err[-3000:]
    step = int(stopped[1])
    assert 200 < step < 400, f"stopped at step {step}, not within the second epoch"
    assert "Traceback" not in err
    assert not (tmp_path / "export").exists() or not os.listdir(tmp_path / "export")

    resumed = run_train(command)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (f"resuming at epoch 2/2, step {step - 200}/200 (global step {step})"
            in resumed.stdout)
    assert "epoch 1/2: loss" not in resumed.stdout
    assert f"(resumed: steps after {step - 200} only)" in resumed.stdout
    assert os.listdir(tmp_path / "export") == ["1"]
    assert not (tmp_path / "run" / "backup").exists()  # Spent once the run is complete.
    history = json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"]
    assert [r["epoch"] for r in history] == [1, 2]

    # The same model as a run that was never interrupted: same batches, same steps, same bits.
    whole = subprocess.run(train_command(data_dir, tmp_path / "whole", *flags),
                           capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=300)
    assert whole.returncode == 0, whole.stderr[-3000:]
    images = test_split.images[:200]
    np.testing.assert_array_equal(served_logits(tmp_path / "export" / "1", images),
                                  served_logits(tmp_path / "whole" / "export" / "1", images))


def test_sigterm_outside_training_raises_at_once_and_inside_waits_for_the_step():
    with preemption.Watch() as watch:
        with watch.training(first_step=0):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # Python runs the handler at the next bytecode.
            assert watch.requested
            watch.reached(7)
        with pytest.raises(Preempted, match="at step 7: nothing new to save"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # Restored afterwards.


# --- The launcher and its workers ----------------------------------------------------------------

def launcher(data_dir, folder, *flags):
    return launch(folder, "multi_worker", f"--data_dir={data_dir}", *flags, popen=True)


def workers_of(pid, count=2):
    """The launcher's worker processes (its start-up watchdogs are their children, not its),
    once each runs its own program: between fork and exec a child still has the launcher's
    environment, without its TF_CONFIG."""
    def started():
        found = children(pid)
        return len(found) == count and all(tf_config_of(child) for child in found)

    wait_for(started, 60, "the workers")
    return children(pid)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.cluster
@pytest.mark.skipif(not ROOT and not os.path.exists("/proc/self/ns/user"),
                    reason="needs root or user namespaces to isolate the workers")
def test_sigterm_to_one_worker_stops_every_worker_at_one_step_and_they_resume(tmp_path, data_dir):
    flags = ["--epochs=2", "--steps_per_epoch=100", "--batch_size=64", "--eval_steps=1"]
    run = launcher(data_dir, tmp_path, *flags)
    chief, other = workers_of(run.pid)
    # Isolated: the workers live in a network namespace of their own, and their servers
    # (which bind every interface) cannot be reached from this one.
    assert os.readlink(f"/proc/{other}/ns/net") != os.readlink("/proc/self/ns/net")
    config = json.loads(open(f"/proc/{other}/environ", "rb").read().split(b"TF_CONFIG=")[1]
                        .split(b"\0")[0])
    port = int(config["cluster"]["worker"][1].rsplit(":", 1)[1])
    backups = Backups(str(tmp_path / "run"), 1, {})
    wait_for(lambda: 100 in backups.steps() or run.poll() is not None, 240, "the first epoch")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    time.sleep(0.3)
    signalled = time.time()
    os.kill(other, signal.SIGTERM)  # One worker only: the other must stop at the same step.
    out, err = run.communicate(timeout=60)
    assert time.time() - signalled < 20
    assert run.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    steps = {worker: int(step) for worker, step in re.findall(
        r"^\[(\d)\] tfdp\.train: preempted \(SIGTERM\) at step (\d+): state of step \d+ saved",
        err, re.M)}
    assert set(steps) == {"0", "1"} and steps["0"] == steps["1"], err[-3000:]
    step = steps["0"]
    assert 100 <= step < 200
    assert "in a private network namespace" in err
    for index in (0, 1):
        assert step in Backups(str(tmp_path / "run"), index, {}).steps()
    assert not (tmp_path / "export").exists() or not os.listdir(tmp_path / "export")
    assert not alive(chief) and not alive(other)

    rerun = launcher(data_dir, tmp_path, *flags)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-3000:]
    assert f"[0] resuming at epoch 2/2, step {step - 100}/100 (global step {step})" in out
    digests = dict(re.findall(r"^\[\d\] final weights sha256 (\w+) \(worker (\d)\)", err, re.M))
    assert len(digests) == 1, err[-2000:]  # Both workers ended with the same weights.
    assert os.listdir(tmp_path / "export") == ["1"]


@pytest.mark.cluster
def test_sigterm_to_the_launcher_preempts_and_sigkill_takes_the_workers_with_it(tmp_path,
                                                                               data_dir):
    run = launcher(data_dir, tmp_path, "--epochs=3", "--steps_per_epoch=100", "--batch_size=64",
                   "--eval_steps=1")
    backups = Backups(str(tmp_path / "run"), 0, {})
    wait_for(lambda: backups.steps() or run.poll() is not None, 240, "the first epoch")
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=60)
    assert run.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    assert "tfdp.launch: SIGTERM; asking the workers to save and stop" in err, err[-3000:]
    assert len(re.findall(r"^\[\d\] tfdp\.train: preempted", err, re.M)) == 2, err[-3000:]

    # SIGKILL cannot be caught: the kernel ends the workers with their launcher.
    run = launcher(data_dir, tmp_path / "killed", "--epochs=1")
    workers = workers_of(run.pid)
    run.kill()
    run.communicate(timeout=30)
    wait_for(lambda: not any(alive(w) for w in workers), 10, "the orphaned workers to die")


@pytest.mark.cluster
def test_ctrl_c_in_a_terminal_reaches_the_launcher_which_has_every_worker_save(tmp_path,
                                                                               data_dir):
    """A real pseudo-terminal: Ctrl-C there signals the terminal's foreground process group,
    the launcher's; the workers, in sessions of their own, are asked by the launcher."""
    run = Terminal(
        [sys.executable, "-m", "tfdp.launch", "--num_workers=2", "--", "--strategy=multi_worker",
         "--epochs=3", "--steps_per_epoch=100", "--batch_size=64", "--eval_steps=1",
         f"--data_dir={data_dir}", f"--workdir={tmp_path / 'run'}",
         f"--export_dir={tmp_path / 'export'}"])
    backups = Backups(str(tmp_path / "run"), 0, {})
    run.wait_for(lambda t: backups.steps(), 240, "the first epoch")
    run.type(b"\x03")  # Ctrl-C, typed.
    returncode = run.finish(60)
    text = run.text
    assert returncode == 130, text[-3000:]
    assert "tfdp.launch: interrupted; asking the workers to save and stop" in text
    assert len(re.findall(r"\[\d\] tfdp\.train: preempted \(SIGTERM\) at step", text)) == 2
    assert "\r[0] epoch 1/3 " in text  # The chief's live progress line, in a terminal.
    assert "Traceback" not in text


@pytest.mark.slow
def test_a_missing_peer_ends_start_up_after_collective_timeout_naming_it(tmp_path, data_dir):
    own, peer = free_ports(2)  # Nothing will listen on the peer's.
    tf_config = json.dumps({"cluster": {"worker": [f"127.0.0.1:{own}", f"127.0.0.1:{peer}"]},
                            "task": {"type": "worker", "index": 0}})
    started = time.time()
    result = subprocess.run(
        train_command(data_dir, tmp_path, "--strategy=multi_worker", "--collective_timeout=5"),
        capture_output=True, text=True, env=dict(child_env(), TF_CONFIG=tf_config), cwd=REPO,
        timeout=120)
    assert result.returncode == 1  # Not 137: supervisors read that as out of memory.
    assert time.time() - started < 60
    lines = [l for l in result.stderr.splitlines() if l.startswith("tfdp.train: error:")]
    assert lines == [f"tfdp.train: error: the cluster did not start within "
                     f"--collective_timeout=5 s: never answered: worker 1 (127.0.0.1:{peer}); "
                     "start every worker of TF_CONFIG (python -m tfdp.launch does) or raise "
                     "--collective_timeout"], result.stderr[-2000:]


def test_the_launcher_warns_in_one_line_where_it_cannot_isolate(tmp_path):
    # A user namespace with no capabilities and no right to make further user namespaces: as
    # an unprivileged user on a kernel that forbids unprivileged user namespaces.
    script = ("echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --inh-caps=-all "
              f"--bounding-set=-all {sys.executable} -m tfdp.launch --num_workers=1 -- --help")
    try:
        result = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script],
                                capture_output=True, text=True, cwd=REPO, timeout=120)
    except FileNotFoundError:
        pytest.skip("needs unshare and setpriv (util-linux)")
    if result.stderr.startswith(("unshare:", "sh:", "setpriv:")):
        pytest.skip(f"no user namespace to test in here: {result.stderr.strip()[:200]}")
    warnings = [l for l in result.stderr.splitlines() if l.startswith("tfdp.launch: warning:")]
    assert len(warnings) == 1 and "cannot isolate the workers" in warnings[0], result.stderr
    assert "listen on every interface" in warnings[0]
    assert result.returncode == 0, result.stderr[-2000:]


# --- Losing work ---------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["manual", "mirrored"])
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
        paths.run(config)
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


def manual_config(tmp_path, data_dir, **overrides):
    settings = dict(num_gpus=2, epochs=3, steps_per_epoch=5, eval_steps=1, batch_size=64,
                    data_dir=data_dir, workdir=str(tmp_path / "run"),
                    export_dir=str(tmp_path / "export"))
    return Config(**dict(settings, **overrides))


def test_a_resume_under_other_flags_is_refused_naming_them(tmp_path, data_dir):
    earlier = manual_config(tmp_path, data_dir)
    backups = Backups(earlier.run_dir, 0, identity(earlier))
    backups.save(5, lenet.to_keras_weights(lenet.init_params(0)))
    with pytest.raises(UserError) as caught:
        paths.run(manual_config(tmp_path, data_dir, lr=0.1, seed=1, batch_size=32))
    assert str(caught.value) == (
        f"{tmp_path / 'run'} holds a run trained with --batch_size=64 --lr=0.2 --seed=0; this "
        "command has --batch_size=32 --lr=0.1 --seed=1: run it with the same flags to resume, "
        "or give it another --workdir")


def test_a_damaged_newest_backup_falls_back_to_the_newest_intact_one(tmp_path, data_dir, capsys,
                                                                    caplog):
    config = manual_config(tmp_path, data_dir)
    backups = Backups(config.run_dir, 0, identity(config))
    weights = lenet.to_keras_weights(lenet.init_params(0, init="glorot"))
    backups.save(5, weights)
    newest = backups.save(10, weights)
    with open(newest, "r+b") as f:  # Truncated, as by a crash of the disk or the copy.
        f.truncate(os.path.getsize(newest) // 2)
    metrics = os.path.join(config.run_dir, "metrics.json")
    with open(metrics, "w") as f:  # The earlier epochs' record, damaged too.
        f.write('{"epochs": [{"epo')
    result = paths.run(config)
    out = capsys.readouterr().out
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings[0] == (f"the backup {newest} is damaged (BadZipFile: File is not a zip "
                           "file); the backup of step 5 is intact")
    assert warnings[1].startswith(f"cannot read the earlier epochs from {metrics} (")
    assert len(warnings) == 2, warnings
    assert "resuming at epoch 2/3, step 0/5 (global step 5)" in out
    assert [r["epoch"] for r in result.history] == [2, 3]  # No metrics.json of epoch 1 here.


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
        # and with room the same command only exports.
        subprocess.run(["mount", "-o", "remount,size=100k", str(small)], check=True)
        command = [sys.executable, "-m", "tfdp.train", "--epochs=2", "--steps_per_epoch=5",
                   "--eval_steps=1", f"--data_dir={data_dir}", f"--workdir={tmp_path / 'run'}",
                   f"--export_dir={small / 'export'}"]
        full = run_train(command)
        assert full.returncode == 1, full.stderr[-3000:]
        assert full.stderr.strip().splitlines()[-1] == (
            f"tfdp.train: error: cannot write the export under {small / 'export'} (No space "
            f"left on device): the trained weights are kept in "
            f"{tmp_path / 'run' / 'backup' / 'worker-0'}; make room and run the same command "
            "again to export")
        assert os.listdir(small / "export") == []  # No version, and no partial one.
        subprocess.run(["mount", "-o", "remount,size=8m", str(small)], check=True)
        rerun = run_train(command)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "resuming a run that finished training (10 steps): exporting it" in rerun.stdout
        assert "epoch 2/2: loss" not in rerun.stdout
        assert os.listdir(small / "export") == ["1"]
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
    assert export.remove_stale_partials(str(tmp_path)) == [stale.name]
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, other_host.name])


@needs_root
def test_a_read_only_prepared_data_dir_trains_and_a_missing_one_says_so(tmp_path, data_dir,
                                                                       manual_dir):
    from tfdp import data, fashion_mnist

    copy = tmp_path / "data"
    subprocess.run(["cp", "-r", data_dir, str(copy)], check=True)
    for root, folders, _ in os.walk(copy):  # As prepared by TFDS, without tfdp's .npy cache.
        if "tfdp-arrays" in folders:
            subprocess.run(["rm", "-r", os.path.join(root, "tfdp-arrays")], check=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (copy, empty):
        subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
    try:
        split = data.load_split("test", str(copy))
        assert len(split.labels) == 10000
        with pytest.raises(UserError, match=r"is not prepared in .*, and it cannot be prepared "
                                            r"there \(Read-only file system\)"):
            fashion_mnist.prepare(str(empty), manual_dir)
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
                paths.run(config)
    finally:
        subprocess.run(["umount", str(folder)], check=False)


# --- Bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("index", [2, -1])
def test_tf_config_task_index_out_of_range_is_one_line(tmp_path, index):
    raw = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                            "task": {"type": "worker", "index": index}})
    message = (f"TF_CONFIG: task index {index} is out of range: the cluster has 2 worker "
               "task(s), indexes 0..1")
    with pytest.raises(UserError, match=re.escape(message)):
        tf_config.task({"TF_CONFIG": raw})
    result = run_module("tfdp.train", "--strategy=multi_worker", f"--workdir={tmp_path}",
                        env={"TF_CONFIG": raw}, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == f"tfdp.train: error: {message}", result.stderr


def test_a_port_in_use_is_named(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    task = tf_config.Task({"worker": [f"127.0.0.1:{port}", "127.0.0.1:1"]}, "worker", 0)
    try:
        with pytest.raises(UserError, match=f"port {port} of TF_CONFIG's worker 0 "
                                            f"\\(127.0.0.1:{port}\\) is already in use"):
            tf_config.check_port_free(task)
    finally:
        holder.close()
    tf_config.check_port_free(task)  # Free again.


def test_a_worker_whose_port_is_taken_says_which_in_one_line(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    tf_config = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}", "127.0.0.1:1"]},
                            "task": {"type": "worker", "index": 0}})
    try:
        result = run_module("tfdp.train", "--strategy=multi_worker", f"--workdir={tmp_path}",
                            env={"TF_CONFIG": tf_config}, timeout=120)
    finally:
        holder.close()
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"tfdp.train: error: port {port} of TF_CONFIG's worker 0 (127.0.0.1:{port}) is already "
        "in use: stop what holds it or give this task another port")


def test_files_written_through_a_temporary_name_never_follow_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "run").mkdir()
    target = tmp_path / "run" / "metrics.json"
    os.symlink(victim, target)
    files.write_atomic(str(target), lambda f: f.write("{}"))
    assert victim.read_text() == "precious"
    assert not os.path.islink(target) and target.read_text() == "{}"


# --- Ctrl-C in a terminal -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("strategy, moment", [  # The start and a second Ctrl-C: every path's.
    ("manual", "starting"), ("manual", "training"), ("mirrored", "training"), ("manual", "twice")])
def test_ctrl_c_in_a_terminal_saves_like_sigterm_and_a_second_stops_at_once(
        tmp_path, data_dir, strategy, moment):
    """Typed into a real pseudo-terminal: at four moments of the start (nothing to save, or the
    first steps), mid-epoch (the step under way finishes and is saved; the same command
    resumes), and twice mid-step (steps of a large batch: the second stops at once, one line,
    exit 130)."""
    batch = 4096 if moment == "twice" else 64  # Steps long enough to type twice during one.
    command = train_command(data_dir, tmp_path, f"--strategy={strategy}", "--num_gpus=2",
                            "--epochs=1", "--steps_per_epoch=400", f"--batch_size={batch}",
                            "--eval_steps=1")
    if moment == "starting":
        # Python's start, TensorFlow's import, TFDS' import, the data, the replicas: whatever
        # was running, one line. (TFDS' __init__ swallows any Exception: a Ctrl-C there once
        # left it half-imported, and a traceback followed.)
        for delay in (0.3, 1.2, 2.1, 3.0):
            run = Terminal(command)
            time.sleep(delay)
            run.type(b"\x03")
            returncode = run.finish(60)
            assert "Traceback" not in run.text and "KeyboardInterrupt" not in run.text, run.text
            endings = re.findall(r"(?m)^tfdp\.train: .*", run.text)
            assert len(endings) == 1 and re.match(
                r"tfdp\.train: preempted \(Ctrl-C\) at step (0: nothing new to save|\d+: state of "
                r"step \d+ saved in )", endings[0]), (delay, run.text[-3000:])
            assert returncode == PREEMPTED_EXIT_CODE, (delay, run.text[-3000:])
        return
    run = Terminal(command)
    run.wait_for(lambda t: re.search(r"\repoch 1/1 +\d+/\d+ ", t.text), 120, "training")
    run.type(b"\x03")
    if moment == "twice":
        time.sleep(0.2)
        run.type(b"\x03")
    returncode = run.finish(60)
    text = run.text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    endings = re.findall(r"(?m)^tfdp\.train: .*", text)
    assert len(endings) == 1, text[-3000:]
    if moment == "twice":
        assert returncode == 130, text[-3000:]
        assert endings[0].startswith("tfdp.train: stopped at once (a second Ctrl-C): the steps "
                                     "since the newest backup are lost"), endings
        assert not os.path.exists(tmp_path / "export" / "1")
        return
    assert returncode == PREEMPTED_EXIT_CODE, text[-3000:]
    step = int(re.match(r"tfdp\.train: preempted \(Ctrl-C\) at step (\d+): state of step \d+ "
                        r"saved in \S+; run the same command again to resume", endings[0])[1])
    assert 0 < step < 400
    assert Backups(str(tmp_path / "run"), 0, {}).steps() == [step]
    resumed = run_train(command)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming at epoch 1/1, step {step}/400 (global step {step})" in resumed.stdout
    assert "exported " in resumed.stdout


@pytest.mark.parametrize("module, strategy, task", [
    ("tfdp.server", None, "worker"),
    ("tfdp.train", "manual", "chief"),
    ("tfdp.train", "parameter_server", "chief"),
])
def test_a_server_or_chief_whose_port_is_taken_says_which_in_one_line(tmp_path, module, strategy,
                                                                      task):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    own = f"127.0.0.1:{port}"
    cluster = {"chief": [own if task == "chief" else "127.0.0.1:1"],
               "worker": [own if task == "worker" else "127.0.0.1:1"]}
    if strategy == "parameter_server":
        cluster["ps"] = ["127.0.0.1:2"]
    args = [f"--strategy={strategy}", f"--workdir={tmp_path}"] if strategy else []
    try:
        result = run_module(module, *args, timeout=120, env={"TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": task, "index": 0}})})
    finally:
        holder.close()
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"{module}: error: port {port} of TF_CONFIG's {task} 0 ({own}) is already in use: stop "
        "what holds it or give this task another port"), result.stderr[-2000:]
