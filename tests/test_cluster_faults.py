"""Three faults every path that spans processes meets, written once and run on each: a worker
slowed and then hung (named as the straggler, then the run ends naming its flight recorder), a
peer killed (the run ends, or the launcher stops it, and the same command resumes), and a peer's
link cut with its process alive (the run ends within ``--collective_timeout`` naming it).

Real processes started by ``tfdp.launch``; real SIGSTOP, SIGCONT and SIGKILL from outside; and,
as root, emulated hosts whose link goes down. The paths: ``manual`` (the from-scratch client of
``tfdp.server`` workers), ``parameter_server`` (a coordinator, workers and servers) and
``multi_worker`` (Keras fit on every worker).
"""

import dataclasses
import json
import os
import re
import signal
import time

import pytest

from processes import (AS_FROM_A_SHELL, alive, backed_up, children, cut_off, launch,
                       slow_then_stop, task_pid, wait_for_first_backup)
from tfdp.launcher import emulated_hosts
from tfdp.training import report
from tfdp.util.errors import LOST_CONTACT_EXIT_CODE

pytestmark = pytest.mark.cluster


@dataclasses.dataclass(frozen=True)
class Path:
    strategy: str
    launcher: tuple           # tfdp.launch's flags
    chief: str                # the prefix of the chief's lines
    straggler: str            # the slowed epoch's line names worker 1 so
    recorder: str             # what its flight recorder holds, as the lost line says
    victim: tuple             # the task killed, and the one whose host is cut off
    victim_name: str          # as the lost line names it
    first_host: int           # the victim's emulated host (the chief's is 0 where it has one)


PATHS = {
    "manual": Path(
        "manual", ("--num_workers=2",), "[chief]",
        r"straggler: worker 1 \(replica 1\) reaches the allreduce \d+\.\d ms after the others on "
        r"average, last in \d+% of steps", "arrival times per replica",
        ("worker", 1), "worker 1", 2),
    "parameter_server": Path(
        "parameter_server", ("--num_workers=2", "--num_ps=1"), "[chief]",
        r"straggler: worker 1 takes \d+\.\d ms a step, "
        r"\d+\.\dx the others' \d+\.\d ms; it ran \d+% of the steps", "step times per worker",
        ("ps", 0), "ps 0", 3),
    "multi_worker": Path(
        "multi_worker", ("--num_workers=2",), "[0]",
        r"straggler: worker 1 \(replica 1\) reaches the allreduce \d+\.\d ms after the others on "
        r"average, last in \d+% of steps", "arrival times per replica",
        ("worker", 1), "worker 1", 1),
}
by_path = pytest.mark.parametrize("path", PATHS.values(), ids=list(PATHS))


def lost_line(path: Path, err: str, why: str = r"[^)]*", peer: str = None):
    """The chief's one line for a lost cluster, or None."""
    peer = peer or rf"{path.victim_name} \([\d.]+:\d+\)"
    return re.search(rf"^{re.escape(path.chief)} tfdp\.train: error: lost contact with the "
                     rf"cluster \({why}\): unreachable now: {peer}; the backup of step \d+ is "
                     r"kept: run the same command again to resume once every worker is "
                     r"reachable", err, re.M)


def nothing_exported(folder) -> bool:
    return not (folder / "export").exists() or os.listdir(folder / "export") == []


@by_path
def test_a_slowed_worker_is_named_and_a_stopped_one_leaves_its_flight_record(tmp_path,
                                                                            data_dir, path):
    """Worker 1 stopped 45 of every 50 ms (real SIGSTOP and SIGCONT from outside: a host with
    a tenth of a CPU) through the second and third epochs, then for good: the third epoch's
    line names it, and the hang ends the run in one line naming the flight recorder's file."""
    # The slowing starts once this process has seen the first backup, some steps into epoch 2
    # on a loaded machine: epoch 3 is the one slowed from its first step to its last. (Judged
    # on epoch 2, a CI run once left the straggler unnamed: Keras fit reads the stamps every 5
    # steps, and too many of the 10 it read came before the slowing. At a quarter of a CPU, on
    # a machine loaded by other tests, the worker was last in 60 to 90 % of the 10 steps read,
    # at the straggler rule's 60 % and once below it: a tenth is last in 80 to 100 %.)
    steps = 50
    run = launch(tmp_path, path.strategy, f"--data_dir={data_dir}", "--epochs=4",
                 f"--steps_per_epoch={steps}", "--batch_size=64", "--eval_steps=1",
                 "--collective_timeout=10", launcher=path.launcher, popen=True)
    out, err = slow_then_stop(run, tmp_path, "worker", 1, epochs=2)
    # multi_worker: the launcher stops the workers once the chief has ended.
    assert (run.returncode != 0 if path.strategy == "multi_worker"
            else run.returncode == LOST_CONTACT_EXIT_CODE), err[-3000:]
    assert "Traceback" not in err, err[-3000:]  # The launcher's, for a hung worker, once.
    # A step stopped for a second or more on a loaded machine is named as a pause too.
    slowed_line = re.search(rf"^{re.escape(path.chief)} epoch 3/4: .*; {path.straggler}"
                            r"(; pause: .*)?$", out, re.M)
    assert slowed_line, out[-3000:]
    if path.strategy == "parameter_server":  # Asynchronous SGD: the staleness, with the pace.
        assert re.search(r", staleness mean [\d.]+ max \d+; straggler", slowed_line[0])
    stopped = re.search(rf"^{re.escape(path.chief)} tfdp\.train: error: lost contact with the "
                        rf"cluster .* \(the last steps' {path.recorder}: "
                        r"(\S+flight_recorder\.json)\)$", err, re.M)
    assert stopped, err[-3000:]
    record = json.loads(open(stopped[1]).read())
    assert record["steps"] and record["steps"][-1]["step"] >= 3 * steps
    if path.strategy == "manual":  # The chief asks each worker: the hung one is named.
        # The hang meets a step, or the chief's look for a worker's SIGTERM between them.
        doing = r"(training steps? [\d-]+|asking the workers whether one was preempted)"
        assert re.search(rf"lost contact with the cluster \(no answer for 10 s while {doing}, "
                         r"--collective_timeout\): not answering now \(its port open, its "
                         r"process stopped or hung\): worker 1 \([\d.]+:\d+\)",
                         stopped[0]), stopped[0]
        assert re.search(rf"while {doing}, --collective_timeout; not answering: worker 1$",
                         record["why"]), record["why"]
    slowed = json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"][2]
    if path.strategy == "parameter_server":
        assert sum(slowed["worker_steps"]) == steps
        assert slowed["worker_step_ms"][1] > slowed["worker_step_ms"][0]
        assert {s["worker"] for s in record["steps"]} <= {"worker 0", "worker 1"}
    else:
        assert slowed["replica_late_ms"][1] > slowed["replica_late_ms"][0]
        assert [r["replica"] for r in record["steps"][-1]["replicas"]] == [
            "worker 0 (replica 0)", "worker 1 (replica 1)"]
    if path.strategy == "multi_worker":  # Keras reads the times at its callback's checks.
        read = [s["step"] for s in record["steps"]]
        assert read[0] % 5 == 0 and read[:5] == list(range(read[0], read[0] + 25, 5)), read


def test_a_worker_paused_for_seconds_is_named_with_its_step(tmp_path, data_dir):
    """The from-scratch path's worker 1 stopped for 4 s mid-epoch (real SIGSTOP, then SIGCONT,
    from outside): once, so no straggler, but the epoch's line names the pause and its step."""
    run = launch(tmp_path, "manual", f"--data_dir={data_dir}", "--epochs=2",
                 "--steps_per_epoch=60", "--batch_size=64", "--eval_steps=1", "--sync_every=1",
                 popen=True)
    wait_for_first_backup(run, tmp_path)
    time.sleep(0.3)
    worker = task_pid(run.pid, "worker", 1)
    os.kill(worker, signal.SIGSTOP)
    time.sleep(4)
    os.kill(worker, signal.SIGCONT)
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-3000:]
    # Stopped computing, the stamps name it; stopped in the exchange, the probe's silence does.
    paused = re.search(r"^\[chief\] epoch 2/2: .*; pause: worker 1 (?:\(replica 1\) reached the "
                       r"allreduce|did not answer for) (\d+\.\d) s (?:after the others )?"
                       r"at step (\d+)$", out, re.M)
    assert paused, out[-3000:]
    # The 4 s stop, and the step it fell in finishing after it: 6.3 s in a whole run here, on
    # a loaded machine; twice the stop would be a straggler's pace, not one pause.
    assert 3.0 <= float(paused[1]) <= 8.0 and 60 < int(paused[2]) <= 120


def test_a_peer_reported_lost_is_named_once_its_exit_closes_its_port():
    """TensorFlow reports a killed peer lost while, on a loaded machine, its exit is still under
    way and its port still accepts (seen in CI: both workers then named only as TensorFlow's
    error names them): the lost line waits for the port to close and names that peer."""
    import socket
    import threading

    from tfdp.cluster import tf_config

    alive, dying = socket.socket(), socket.socket()
    for s in (alive, dying):
        s.bind(("127.0.0.1", 0))
        s.listen()
    peers = [(f"worker {i}", f"127.0.0.1:{s.getsockname()[1]}")
             for i, s in enumerate((alive, dying))]
    error = "/job:worker/replica:0/task:0 /job:worker/replica:0/task:1 unavailable"
    try:
        threading.Timer(0.5, dying.close).start()
        line = tf_config.lost_contact("UnavailableError", peers, error, [20])
        assert f"unreachable now: worker 1 ({peers[1][1]}); the backup of step 20" in line, line
        # Every peer still there (a cluster TensorFlow lost for another reason): the wait is
        # bounded, and the line names what TensorFlow's error names.
        started = time.monotonic()
        line = tf_config.lost_contact("UnavailableError", peers[:1], error, [20])
        assert "unreachable now: worker 0 (reported unhealthy), worker 1 (reported" in line
        assert time.monotonic() - started < tf_config.EXIT_SETTLES_S + 2
    finally:
        alive.close()


@by_path
def test_a_killed_peer_ends_the_run_and_the_same_command_resumes(tmp_path, data_dir, path):
    """SIGKILL to one peer in the middle of the second epoch, after a backup within it
    (``--backup_every``): the run ends within a minute or two (multi_worker: the launcher stops
    the others), nothing is exported, and the same command resumes from the newest step every
    worker backed up, inside the epoch, finishes and exports once."""
    train = [f"--data_dir={data_dir}", "--epochs=3", "--steps_per_epoch=20", "--eval_steps=1",
             "--backup_every=5"]
    # As from a user's shell: TensorFlow's C++ log at tfdp's own threshold, not the tests'.
    run = launch(tmp_path, path.strategy, *train, launcher=path.launcher, popen=True,
                 env=AS_FROM_A_SHELL)
    keeping = 2 if path.strategy == "multi_worker" else 1  # The tasks that keep backups.
    wait_for_first_backup(run, tmp_path, step=25, workers=keeping)  # Epoch 2's step 5.
    if path.strategy == "multi_worker":
        victim = children(run.pid)[1]
    else:
        victim = task_pid(run.pid, *path.victim)
    os.kill(victim, signal.SIGKILL)
    killed = time.time()
    out, err = run.communicate(timeout=240)
    assert run.returncode != 0, err[-3000:]
    assert time.time() - killed < 120
    kind, index = path.victim
    if path.strategy == "multi_worker":
        assert "exited with -9" in err, err[-3000:]
    else:
        assert run.returncode == LOST_CONTACT_EXIT_CODE  # The chief's, which decides.
        assert lost_line(path, err, why=r"\w+"), err[-3000:]
    if path.strategy == "manual":
        assert f"tfdp.launch: {kind} {index} exited with -9 while the chief runs" in err
        assert re.search(r"\(the last steps' arrival times per replica: \S+flight_recorder"
                         r"\.json\)$", err, re.M), err[-3000:]
    assert "Traceback" not in err
    # No wall of TensorFlow's C++ lines (gRPC statuses, aborted collectives) around tfdp's own.
    assert not re.search(r"^\S+ [IWE]\d{4} [\d:.]+ +\d+ \S+\.cc:\d+\]", err, re.M), err[-3000:]
    if path.strategy != "multi_worker":  # The chief's one line is the last it says.
        chief = [line for line in err.splitlines() if line.startswith(path.chief)]
        assert lost_line(path, chief[-1]), err[-3000:]
    assert nothing_exported(tmp_path)
    saved = backed_up(tmp_path / "run", keeping)
    assert 20 < saved < 40, saved  # Inside the second epoch: steps 21 to 40.

    rerun = launch(tmp_path, path.strategy, *train, launcher=path.launcher)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (f"{path.chief} resuming at epoch 2/3, step {saved - 20}/20 (global step {saved})"
            in rerun.stdout), rerun.stdout[-3000:]
    assert f"{path.chief} epoch 1/3: loss" not in rerun.stdout  # Not redone.
    assert f"{path.chief} epoch 3/3: loss" in rerun.stdout
    assert [r["epoch"] for r in report.load_history(str(tmp_path / "run"), 3)] == [1, 2, 3]
    assert os.listdir(tmp_path / "export") == ["1"]


@by_path
@pytest.mark.root("emulated hosts: network namespaces")
def test_a_peer_cut_off_ends_the_run_within_the_timeout_naming_it(tmp_path, data_dir, path):
    """The victim's emulated host loses its link, its process alive: the run ends within
    ``--collective_timeout`` (plus a margin) in one line naming it, and leaves no namespace."""
    run = launch(tmp_path, path.strategy, f"--data_dir={data_dir}", "--epochs=3",
                 "--steps_per_epoch=30", "--batch_size=64", "--eval_steps=1",
                 "--collective_timeout=10", launcher=(*path.launcher, "--hosts"), popen=True)
    wait_for_first_backup(run, tmp_path)
    host, cut = cut_off(run.pid, path.first_host)
    out, err = run.communicate(timeout=120)
    assert run.returncode != 0, err[-3000:]
    assert time.time() - cut < 10 + 30
    address = re.search(rf"host {path.first_host} \({host}\) at ([\d.]+) ", err)[1]
    peer = rf"{path.victim_name} \({re.escape(address)}:\d+\)"
    assert lost_line(path, err, peer=peer), err[-3000:]
    if path.strategy == "parameter_server":
        # The server, alive but cut off, cannot reach the chief either, and says so.
        assert re.search(r"^\[ps 0\] tfdp\.server: error: lost the chief at [\d.]+:\d+: no "
                         r"answer for 3 s \(a link down, or its machine gone\); stopping$",
                         err + out, re.M), (out + err)[-3000:]
    assert "Traceback" not in err
    assert nothing_exported(tmp_path)
    assert not any(n.startswith(f"{emulated_hosts.PREFIX}{run.pid}-")
                   for n in emulated_hosts.namespaces())


CHIEF_TASK = {"manual": ("chief", 0), "parameter_server": ("chief", 0),
              "multi_worker": ("worker", 0)}


@pytest.mark.parametrize("path", [PATHS[name] for name in CHIEF_TASK], ids=list(CHIEF_TASK))
def test_a_stop_while_a_peer_hangs_ends_within_the_grace_period_naming_the_backup(
        tmp_path, data_dir, path):
    """A peer hung (real SIGSTOP: alive, never answering), then a real SIGTERM to the chief, as
    a cluster manager sends when it ends a job: the chief's step waits in a collective for the
    peer (up to --collective_timeout, 300 s), so no step can be saved, and it ends within
    ``STOP_WITHIN`` s of the signal, well inside Kubernetes' and Slurm's 30 s, in one line
    naming its newest backup. (Under multi_worker TensorFlow's own heartbeats may name the
    hung peer first, as promptly.)"""
    from tfdp.training.preemption import STOP_WITHIN

    run = launch(tmp_path, path.strategy, f"--data_dir={data_dir}", "--epochs=20",
                 "--steps_per_epoch=30", "--eval_steps=1", launcher=path.launcher, popen=True,
                 env=AS_FROM_A_SHELL)
    wait_for_first_backup(run, tmp_path)
    victim, chief = task_pid(run.pid, *path.victim), task_pid(run.pid, *CHIEF_TASK[path.strategy])
    os.kill(victim, signal.SIGSTOP)
    try:
        time.sleep(1)  # The chief's next step waits for it.
        os.kill(chief, signal.SIGTERM)
        asked = time.time()
        while alive(chief) and time.time() - asked < 60:
            time.sleep(0.05)
        took = time.time() - asked
    finally:
        os.kill(victim, signal.SIGKILL)  # A stopped process dies of SIGKILL too.
    out, err = run.communicate(timeout=120)
    assert took < STOP_WITHIN + 5, (took, err[-3000:])
    if path.strategy == "multi_worker" and lost_line(path, err, peer=r"[^;]*worker 1 "
                                                                     r"\(reported unhealthy\)"):
        # TensorFlow's coordination service missed the hung worker's heartbeats first (it did
        # in a run here): a lost peer's line, as promptly.
        return
    assert took > STOP_WITHIN - 1, (took, err[-3000:])
    line = re.search(rf"^{re.escape(path.chief)} tfdp\.train: preempted \(SIGTERM\) while "
                     rf"training: no step of the cluster finished within {STOP_WITHIN:g} s \(a "
                     r"peer lost\?\), so nothing new is saved; the newest backup, of step "
                     r"(\d+), is in (\S+); run the same command again to resume$", err, re.M)
    assert line, err[-3000:]
    assert int(line[1]) >= 30 and line[2] == str(tmp_path / "run" / "backup" / "worker-0")
    assert "Traceback" not in err
    assert nothing_exported(tmp_path)
