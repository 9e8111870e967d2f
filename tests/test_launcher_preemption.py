"""Preemption of a launched cluster, as a scheduler or a user sends it: SIGTERM to one worker
(every worker saves one step, and the same command resumes from it), SIGTERM while a worker waits
for its peer, SIGHUP and SIGKILL to the launcher, Ctrl-C typed in a real terminal. The signal
handling inside one process: tests/test_preemption.py."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import REPO, ROOT
from processes import (alive, child_env, children, launch, tf_config_of, train_command,
                       wait_for)
from terminal import Terminal
from tfdp.launcher.processes import free_ports
from tfdp.training.backups import Backups
from tfdp.util.errors import PREEMPTED_EXIT_CODE

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
def test_a_sigterm_while_a_worker_waits_for_its_peer_stops_both_at_step_0(tmp_path, data_dir):
    """A ``multi_worker`` worker whose peer is late waits inside the strategy's creation, while
    TensorFlow's own SIGTERM handler is in place: a SIGTERM then waits for tfdp's handler (any
    thread but the main one took it, and it was lost: the run trained to its end, exit 0), and
    both workers stop at step 0 once the peer comes."""
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}

    def worker(index):
        env = child_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                              "task": {"type": "worker", "index": index}}))
        return subprocess.Popen(
            train_command(data_dir, tmp_path, "--strategy=multi_worker", "--num_gpus=1",
                          "--epochs=1", "--steps_per_epoch=40", "--batch_size=32",
                          "--eval_steps=1", "--collective_timeout=120"),
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=REPO)

    def serving(port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    first = worker(0)
    wait_for(lambda: serving(ports[0]) or first.poll() is not None, 120, "worker 0's server")
    first.send_signal(signal.SIGTERM)  # Worker 0 waits for worker 1 to register.
    time.sleep(1)
    second = worker(1)
    for process in (first, second):
        err = process.communicate(timeout=180)[1]
        assert process.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
        assert "tfdp.train: preempted (SIGTERM) at step 0: nothing new to save" in err, err[-3000:]


@pytest.mark.cluster
def test_sighup_to_the_launcher_preempts_and_sigkill_takes_the_workers_with_it(tmp_path,
                                                                              data_dir):
    """SIGHUP (its terminal closed, its ssh session lost) is a stop signal for the launcher as
    SIGTERM is (tests/test_resume_exactly.py sends that one to the parameter servers'
    launcher): every worker saves and the launcher exits 75."""
    run = launcher(data_dir, tmp_path, "--epochs=3", "--steps_per_epoch=100", "--batch_size=64",
                   "--eval_steps=1")
    backups = Backups(str(tmp_path / "run"), 0, {})
    wait_for(lambda: backups.steps() or run.poll() is not None, 240, "the first epoch")
    run.send_signal(signal.SIGHUP)
    out, err = run.communicate(timeout=60)
    assert run.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    assert "tfdp.launch: SIGHUP; asking the workers to save and stop" in err, err[-3000:]
    assert len(re.findall(r"^\[\d\] tfdp\.train: preempted", err, re.M)) == 2, err[-3000:]

    # SIGKILL cannot be caught: the kernel ends the workers with their launcher.
    run = launcher(data_dir, tmp_path / "killed", "--epochs=1")
    workers = workers_of(run.pid)
    run.kill()
    run.communicate(timeout=30)
    wait_for(lambda: not any(alive(w) for w in workers), 10, "the orphaned workers to die")


@pytest.mark.cluster
@pytest.mark.parametrize("times", [1, 2])
def test_ctrl_c_in_a_terminal_reaches_the_launcher_which_has_every_worker_save(tmp_path,
                                                                               data_dir, times):
    """A real pseudo-terminal: Ctrl-C there signals the terminal's foreground process group,
    the launcher's; the workers, in sessions of their own, are asked by the launcher, and all
    saved is a preemption (75). A second Ctrl-C, typed while they finish a step (a large
    batch: seconds here), stops them at once (130), naming the run folder the workers chose."""
    batch = 8192 if times == 2 else 64
    workdir = [f"--workdir={tmp_path / 'run'}"] if times == 1 else []  # Else the default one.
    run = Terminal(
        [sys.executable, "-m", "tfdp.launch", "--num_workers=2", "--", "--strategy=multi_worker",
         "--epochs=3", "--steps_per_epoch=100", f"--batch_size={batch}", "--eval_steps=1",
         f"--data_dir={data_dir}", *workdir, f"--export_dir={tmp_path / 'export'}"],
        cwd=tmp_path)
    backups = Backups(str(tmp_path / "run"), 0, {})
    if times == 2:  # Into the first epoch's long steps.
        run.wait_for(lambda t: "\r[0] epoch 1/3 " in t.text, 240, "training")
    else:
        run.wait_for(lambda t: backups.steps(), 240, "the first epoch")
    run.type(b"\x03")  # Ctrl-C, typed.
    if times == 2:
        run.wait_for(lambda t: "asking the workers to save" in t.text, 10, "the first Ctrl-C")
        run.type(b"\x03")
    returncode = run.finish(60)
    text = run.text
    assert "tfdp.launch: interrupted; asking the workers to save and stop" in text
    if times == 2:
        assert returncode == 130, text[-3000:]
        folder, = os.listdir(tmp_path / "runs")
        assert text.rstrip().splitlines()[-1] == (
            "tfdp.launch: stopped at once (a second Ctrl-C): the steps since the newest backup "
            f"are lost; run the same command again with --workdir=runs/{folder} to resume "
            "from it")
        assert "did not stop; killing it" not in text
        return
    assert returncode == PREEMPTED_EXIT_CODE, text[-3000:]
    assert len(re.findall(r"\[\d\] tfdp\.train: preempted \(SIGTERM\) at step", text)) == 2
    assert "\r[0] epoch 1/3 " in text  # The chief's live progress line, in a terminal.
    assert "Traceback" not in text


# Each thread but the main one, after tfdp has imported TensorFlow: whether SIGTERM is open.
