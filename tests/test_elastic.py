"""``python -m tfdp.launch --num_workers=MIN:MAX``: a multi_worker group, or a from-scratch
client's servers, that loses workers goes on with the others, without the user, and ends on the
model of a run never interrupted (float64), since the global batch and the data order stay the
run's. Real processes, real signals from outside to random workers at random moments."""

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from processes import (backed_up, children, launch, run_module, task_pid, tf_config_of,
                       wait_for)
from same_model import served_logits
from tfdp.bench import elastic
from tfdp.launcher import regrouping
from tfdp.config.settings import Config
from tfdp.launcher.elastic import Group
from tfdp.training import entry
from tfdp.util.errors import UserError

STEPS = 24  # Steps per epoch, two epochs; backups every 4 steps.
SETTINGS = dict(precision="float64", epochs=2, steps_per_epoch=STEPS, batch_size=48, lr=0.1,
                eval_steps=1, seed=4)


@pytest.mark.cluster
def test_a_group_that_loses_and_takes_workers_goes_on_and_trains_the_same_model(
        tmp_path, data_dir, test_split):
    """Three workers of ``--num_workers=1:3 --max_restarts=1`` (16 examples each a step), and
    from outside: a SIGKILL to a random worker once every worker has backed up a random step of
    the first epoch (it is started again: the group stays three); a SIGSTOP to another at a
    later step (hung: the others' watchdog, --collective_timeout=10, gives up on it, and the
    group goes on with two, 24 examples each); SIGUSR1 to the launcher as they train (a worker joins: every
    worker saves one common step and the group of three resumes from it, nothing lost); a last
    SIGKILL at a moment chosen at random, a later step or as the last epoch's line is said (its
    final backup, the export; on with two). Each time the launcher says who left or joined and
    what the group does (the survivors' own lines say the launcher re-forms it); the run
    finishes, exports once and leaves no backup, and the model is the one two devices train
    never interrupted, within 1e-9 in float64."""
    run = launch(tmp_path, "multi_worker", f"--data_dir={data_dir}", "--backup_every=4",
                 "--collective_timeout=10", *[f"--{k}={v}" for k, v in SETTINGS.items()],
                 launcher=("--num_workers=1:3", "--max_restarts=1"), popen=True,
                 stderr=subprocess.STDOUT)
    out = []
    reader = threading.Thread(target=lambda: out.extend(run.stdout), daemon=True)
    reader.start()
    chosen = random.Random()
    step, moment = chosen.randrange(4, STEPS // 2), chosen.choice(["a later step", "the end"])

    def backed_up_after(step, size):
        wait_for(lambda: backed_up(tmp_path / "run", size) > step or run.poll() is not None,
                 300, f"every worker's backup of a step after {step}")

    backed_up_after(step - 1, 3)
    seen = backed_up(tmp_path / "run", 3)
    lost = [_kill_a_worker(run, chosen, 3)]  # Started again.
    killed = time.monotonic()
    resumed = _resumed(run, out, 1)
    took = time.monotonic() - killed
    assert resumed >= seen, (seen, "".join(out)[-3000:])
    backed_up_after(resumed + 3, 3)
    lost.append(_kill_a_worker(run, chosen, 3, signal.SIGSTOP))  # Hung: on with two.
    backed_up_after(_resumed(run, out, 2) + 3, 2)
    os.kill(run.pid, signal.SIGUSR1)  # One joins.
    joined = _resumed(run, out, 3)
    if moment == "a later step":
        backed_up_after(joined + 3, 3)
    else:
        wait_for(lambda: sum(line.startswith("[0] epoch 2/2:") for line in out) == 1
                 or run.poll() is not None, 300, "the last epoch's line")
    lost.append(_kill_a_worker(run, chosen, 3))  # On with two.
    assert run.wait(300) == 0, "".join(out)[-3000:]
    reader.join(10)
    text = "".join(out)
    assert re.search(rf"^tfdp\.launch: worker {lost[0]} left \(exited with -9\); starting it "
                     r"again \(1/1 of --max_restarts\): the group of 3 re-forms from the newest "
                     r"backup every worker has$", text, re.M), text[-3000:]
    for index, why in zip(lost[1:], ("hung: its peers lost contact with it", "exited with -9")):
        assert re.search(rf"^tfdp\.launch: worker {index} left \({why}\); going on with 2 of "
                         r"--num_workers=1:3: the group re-forms from the newest backup every "
                         r"worker has, at the same global batch$", text, re.M), (
            moment, text[-3000:])
    assert re.search(r"^tfdp\.launch: a worker joins \(SIGUSR1\): every worker saves one common "
                     r"step, and the group re-forms from it with 3 of --num_workers=1:3$", text,
                     re.M), text[-3000:]
    saved = set(re.findall(r"^\[\d\] tfdp\.train: preempted \(SIGTERM\) at step (\d+): state of "
                           r"step \1 saved in \S+; a worker joins: tfdp\.launch --num_workers=1:3 "
                           r"--max_restarts=1 re-forms the group from it, one larger$", text, re.M))
    assert saved == {str(joined)}, (saved, joined, text[-3000:])  # Nothing lost by the join.
    assert "run the same command again" not in text, text[-3000:]  # The launcher does.
    assert not (tmp_path / "run" / regrouping.MARK).exists()
    assert "global batch 48 = 24 + 24 per replica" in text, text[-3000:]
    survivors = re.findall(r"^\[\d\] tfdp\.train: error: lost contact .*$", text, re.M)
    assert survivors and all("the backup of step" in line and ": tfdp.launch --num_workers=1:3 "
                             "--max_restarts=1 re-forms the group" in line
                             for line in survivors), survivors
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [r["epoch"] for r in metrics["epochs"]] == [1, 2]
    assert os.listdir(tmp_path / "export") == ["1"]
    assert not (tmp_path / "run" / "backup").exists()  # The departed workers' too.
    print(f"re-formed and resuming {took:.1f} s after the first loss; the last at {moment}")

    _serves_like_two_devices_never_interrupted(
        tmp_path, data_dir, test_split, "mirrored", f"workers {lost} killed from step {seen}, one "
        f"joined at step {joined}, the last lost at {moment}")


@pytest.mark.cluster
def test_a_from_scratch_client_that_loses_a_server_goes_on_and_trains_the_same_model(
        tmp_path, data_dir, test_split):
    """The from-scratch path across machines, ``--num_workers=1:2``: its client and two
    ``tfdp.server`` workers of one device each, and from outside a SIGKILL to a random server
    once the client has backed up a random step of the first epoch: the client's step cannot
    finish without it, so the launcher stops the client at once and the group re-forms with one
    server (48 examples a step on its one device) from the client's newest backup; then SIGUSR1
    to the launcher: the client saves its step and the group of two resumes from exactly it;
    then a SIGSTOP to a random server as soon as they train (hung: the client's watchdog,
    --collective_timeout=20, gives up on it, while training or exporting, and the group goes
    on with one fresh server, which trains the rest or exports). The model is the one two
    local devices train never interrupted, within 1e-9 in float64."""
    run = launch(tmp_path, "manual", f"--data_dir={data_dir}", "--backup_every=4",
                 "--collective_timeout=20", *[f"--{k}={v}" for k, v in SETTINGS.items()],
                 launcher=("--num_workers=1:2",), popen=True, stderr=subprocess.STDOUT)
    out = []
    reader = threading.Thread(target=lambda: out.extend(run.stdout), daemon=True)
    reader.start()
    chosen = random.Random()
    step = chosen.randrange(4, STEPS // 2)
    wait_for(lambda: backed_up(tmp_path / "run") >= step or run.poll() is not None, 300,
             f"the client's backup of step {step}")
    seen = backed_up(tmp_path / "run")
    lost = [_signal_a_server(run, chosen, signal.SIGKILL)]
    resumed = _resumed(run, out, 1, "chief")
    assert resumed >= seen, (seen, "".join(out)[-3000:])
    wait_for(lambda: backed_up(tmp_path / "run") > resumed + 3 or run.poll() is not None, 300,
             f"the client's backup of a step after {resumed + 3}")
    os.kill(run.pid, signal.SIGUSR1)  # One joins.
    joined = _resumed(run, out, 2, "chief")
    # The group of two trains (its servers answered before the resume line): a server stopped
    # now hangs in training, an evaluation or the export, wherever the client has got to.
    lost.append(_signal_a_server(run, chosen, signal.SIGSTOP))  # Hung: on with one.
    assert run.wait(300) == 0, "".join(out)[-3000:]
    reader.join(10)
    text = "".join(out)
    for index, why in zip(lost, ("exited with -9", "hung: the chief lost contact with it")):
        assert re.search(rf"^tfdp\.launch: worker {index} left \({why}\); going on with 1 of "
                         r"--num_workers=1:2: the group re-forms from the chief's newest "
                         r"backup, at the same global batch$", text, re.M), text[-3000:]
    assert re.search(r"^\[chief\] tfdp\.train: error: lost contact with the cluster .*not "
                     r"answering now .*: tfdp\.launch --num_workers=1:2 re-forms the group",
                     text, re.M), text[-3000:]
    # The stop lands in the last steps or the export: the third resume, at a step or of a run
    # that finished training, exports.
    assert len(re.findall(r"^\[chief\] resuming ", text, re.M)) == 3, text[-3000:]
    assert "global batch 48 = 48 per replica" in text, text[-3000:]
    assert re.search(r"^tfdp\.launch: a worker joins \(SIGUSR1\): the chief saves its step, "
                     r"and the group re-forms from it with 2 of --num_workers=1:2$", text,
                     re.M), text[-3000:]
    saved = re.findall(r"^\[chief\] tfdp\.train: preempted \(SIGTERM\) at step (\d+): state of "
                       r"step \1 saved in \S+; a worker joins: tfdp\.launch --num_workers=1:2 "
                       r"re-forms the group from it, one larger$", text, re.M)
    assert saved == [str(joined)], (saved, joined, text[-3000:])  # Nothing lost by the join.
    assert "run the same command again" not in text, text[-3000:]
    # Stopped at once, the survivor says nothing of a save it could not make.
    assert "asking the chief" not in text, text[-3000:]
    assert os.listdir(tmp_path / "export") == ["1"]
    assert not (tmp_path / "run" / "backup").exists()

    _serves_like_two_devices_never_interrupted(
        tmp_path, data_dir, test_split, "manual",
        f"server {lost[0]} killed from step {seen}, one joined at step {joined}, server "
        f"{lost[1]} stopped later")


@pytest.mark.cluster
def test_a_killed_client_is_started_again_and_its_group_trains_on_from_its_backup(
        tmp_path, data_dir):
    """``--num_workers=2 --max_restarts=1`` on the from-scratch path: a SIGKILL from outside
    to the client itself (the chief, which keeps the run's state) once it has backed up a
    random step of the first epoch; its servers hold nothing, so the launcher starts the group
    again, fresh servers and the client from its newest backup, and the run finishes. (The model
    a resumed client trains is the uninterrupted one: tests/test_resume_exactly.py.)"""
    run = launch(tmp_path, "manual", f"--data_dir={data_dir}", "--backup_every=4", "--epochs=2",
                 f"--steps_per_epoch={STEPS}", "--batch_size=48", "--eval_steps=1",
                 launcher=("--num_workers=2", "--max_restarts=1"), popen=True,
                 stderr=subprocess.STDOUT)
    out = []
    reader = threading.Thread(target=lambda: out.extend(run.stdout), daemon=True)
    reader.start()
    step = random.Random().randrange(4, STEPS // 2)
    wait_for(lambda: backed_up(tmp_path / "run") >= step or run.poll() is not None, 300,
             f"the client's backup of step {step}")
    seen = backed_up(tmp_path / "run")
    os.kill(task_pid(run.pid, "chief", 0), signal.SIGKILL)
    resumed = _resumed(run, out, 1, "chief")
    assert run.wait(300) == 0, "".join(out)[-3000:]
    reader.join(10)
    text = "".join(out)
    assert seen <= resumed < STEPS, (seen, resumed, text[-3000:])
    assert re.search(r"^tfdp\.launch: the chief left \(exited with -9\); starting it again \(1/1 "
                     r"of --max_restarts\): the group of 2 re-forms from the chief's newest "
                     r"backup$", text, re.M), text[-3000:]
    assert "Traceback" not in text and "[chief] epoch 2/2: loss" in text, text[-3000:]
    assert os.listdir(tmp_path / "export") == ["1"]
    assert not (tmp_path / "run" / "backup").exists()


@pytest.mark.cluster
@pytest.mark.root("emulated hosts: network namespaces")
def test_a_group_on_emulated_hosts_goes_on_without_a_host_cut_off(tmp_path, data_dir):
    """``--num_workers=1:2 --hosts``: worker 1's host loses its link, its process alive, once
    every worker has backed up a step; the others lose contact with it within
    --collective_timeout, the launcher finds that host's link down and re-forms the group on the
    hosts still reachable, from the newest backup; a worker asking to join then has no host up
    and free; the run finishes, exports once and leaves no namespace."""
    from processes import cut_off
    from tfdp.launcher import emulated_hosts

    run = launch(tmp_path, "multi_worker", f"--data_dir={data_dir}", "--backup_every=4",
                 "--epochs=2", f"--steps_per_epoch={STEPS}", "--batch_size=48", "--eval_steps=1",
                 "--collective_timeout=10", launcher=("--num_workers=1:2", "--hosts"),
                 popen=True, stderr=subprocess.STDOUT)
    out = []
    reader = threading.Thread(target=lambda: out.extend(run.stdout), daemon=True)
    reader.start()
    wait_for(lambda: backed_up(tmp_path / "run", 2) >= 4 or run.poll() is not None, 300,
             "every worker's first backup")
    seen = backed_up(tmp_path / "run", 2)
    cut_off(run.pid, 1)
    resumed = _resumed(run, out, 1)
    os.kill(run.pid, signal.SIGUSR1)
    assert run.wait(300) == 0, "".join(out)[-3000:]
    reader.join(10)
    text = "".join(out)
    assert resumed >= seen, (seen, resumed, text[-3000:])
    assert re.search(r"^tfdp\.launch: worker 1 left \(its host's link is down\); going on with 1 "
                     r"of --num_workers=1:2: the group re-forms from the newest backup every "
                     r"worker has, at the same global batch$", text, re.M), text[-3000:]
    assert ("tfdp.launch: a worker asked to join (SIGUSR1); no emulated host is up and free for "
            "it") in text, text[-3000:]
    assert re.search(r"^tfdp\.launch: host 1 \(no process now\) sent ", text, re.M), text[-3000:]
    assert "Traceback" not in text and os.listdir(tmp_path / "export") == ["1"]
    assert not any(n.startswith(f"{emulated_hosts.PREFIX}{run.pid}-")
                   for n in emulated_hosts.namespaces())


def _signal_a_server(run, chosen, how) -> int:
    """Send ``how`` to a random one of the client's two ``tfdp.server`` workers: its index."""
    servers = {task_of["task"]["index"]: pid for pid in children(run.pid)
               if (task_of := tf_config_of(pid)) and task_of["task"]["type"] == "worker"}
    assert sorted(servers) == [0, 1], servers
    victim = chosen.choice(sorted(servers))
    os.kill(servers[victim], how)
    return victim


def _serves_like_two_devices_never_interrupted(tmp_path, data_dir, test_split, strategy, what):
    """The group's export serves, within 1e-9 in float64, the logits of ``strategy`` on two
    local devices never interrupted (trained here, in the test process)."""
    reference = entry.train(Config(strategy=strategy, num_gpus=2, data_dir=data_dir,
                                   workdir=str(tmp_path / "whole"),
                                   export_dir=str(tmp_path / "whole-export"), **SETTINGS))
    ours = served_logits(tmp_path / "export" / "1", test_split.images[:256])
    theirs = served_logits(reference.export_path, test_split.images[:256])
    assert np.abs(ours - theirs).max() <= 1e-9, (
        f"{what}: {np.abs(ours - theirs).max():.3g} away in the logits from two devices never "
        "interrupted")


def _resumed(run, out: list, times: int, reporter: str = "0") -> int:
    """The global step the group resumed at the ``times``-th time it re-formed (as its
    ``reporter`` says it: worker 0, or the client's ``chief``)."""
    pattern = (rf"^\[{reporter}\] resuming (?:at epoch \d/2, step \d+/24 \(global step "
               r"|a run that finished training \()(\d+)")
    wait_for(lambda: len(re.findall(pattern, "".join(out), re.M)) >= times
             or run.poll() is not None, 300, "the group to re-form")
    found = re.findall(pattern, "".join(out), re.M)
    assert len(found) >= times, "".join(out)[-3000:]
    return int(found[times - 1])


def test_a_worker_other_than_the_chief_resuming_after_the_last_step_has_no_final_figures(
        tmp_path):
    """A group re-formed after its last step's backup (a worker lost during the export) resumes
    a run that finished training on every worker; the others than the chief have no epoch
    records (they are in the chief's metrics.json) and once ended with an IndexError there."""
    from tfdp.training.report import Reporter

    reporter = Reporter(str(tmp_path), {}, ["/job:worker/task:1"], is_chief=False)
    assert reporter.final_line() == ""


def test_the_workers_that_lost_contact_with_a_lost_one_are_counted_as_survivors():
    """Survivors of a loss end on their own within seconds ("lost contact", exit 69), and a
    launcher slowed on a loaded machine may look only after some have: they can re-form, so
    they are not counted lost; nor are they when every worker only lost contact (the group ends
    then, with their code)."""
    from tfdp.launcher import supervise
    from tfdp.util.errors import LOST_CONTACT_EXIT_CODE as LOST_CONTACT

    class Ended:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    group = [Ended(LOST_CONTACT), Ended(-9), Ended(LOST_CONTACT)]
    assert supervise.supervise(group, 0.01, 1.0, going_on=1) == supervise.Left([(1, -9)])
    assert supervise.supervise(group, 0.01, 1.0, going_on=3) == 128 + 9
    assert supervise.supervise([Ended(LOST_CONTACT)] * 2, 0.01, 1.0, going_on=1) == LOST_CONTACT


def test_a_client_whose_server_ended_goes_on_only_where_the_server_was_lost(monkeypatch):
    """A from-scratch client's group (``supervise.supervise_client`` with ``going_on``): a
    server killed is lost whether the client is still stepping or has already lost contact
    with it (a launcher polling late finds both ended); a server that stopped because the
    client finished (0) or saves for a preemption (75) is not; nor is any where fewer than
    ``going_on`` would be left."""
    from tfdp.launcher import supervise
    from tfdp.util.errors import LOST_CONTACT_EXIT_CODE as LOST_CONTACT
    from tfdp.util.errors import PREEMPTED_EXIT_CODE as PREEMPTED

    class Ended:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    roles = [SimpleNamespace(role=r) for r in ("chief", "worker 0", "worker 1")]
    watch = lambda *codes, going_on=1: supervise.supervise_client(  # noqa: E731
        [Ended(c) for c in codes], roles, 0.01, going_on=going_on)
    assert watch(None, None, -9) == supervise.Left([(1, -9)])
    assert watch(LOST_CONTACT, -9, None) == supervise.Left([(0, -9)])
    assert watch(0, 0, 0) == 0
    assert watch(PREEMPTED, PREEMPTED, None) == PREEMPTED
    assert watch(LOST_CONTACT, -9, -9) == LOST_CONTACT  # None left to go on with.
    assert watch(LOST_CONTACT, None, -9, going_on=2) == LOST_CONTACT
    # The client lost contact while both servers run: the one stopped by a signal hung, else
    # one it cannot name.
    stopped = Ended(None)
    monkeypatch.setattr(supervise, "_stopped", lambda proc: proc is stopped)
    assert supervise.supervise_client([Ended(LOST_CONTACT), Ended(None), stopped], roles, 0.01,
                                      going_on=1) == supervise.Left([(1, None)])
    assert watch(LOST_CONTACT, None, None) == supervise.Left([(None, None)])
    assert watch(LOST_CONTACT, None, None, going_on=2) == LOST_CONTACT
    group = Group((1, 2), 0, "1:2", client=True)
    assert group.lose([(1, -9)]) == [
        "tfdp.launch: worker 1 left (exited with -9); going on with 1 of --num_workers=1:2: "
        "the group re-forms from the chief's newest backup, at the same global batch"]
    assert group.joining() == (True, "tfdp.launch: a worker joins (SIGUSR1): the chief saves "
                                     "its step, and the group re-forms from it with 2 of "
                                     "--num_workers=1:2")
    group.grow()
    assert group.lose([(None, None)])[0].startswith(
        "tfdp.launch: a worker left (hung: the chief lost contact with it); going on with 1 of ")
    # On emulated hosts: the server whose host's link is down, whatever the others do.
    assert supervise.supervise_client([Ended(LOST_CONTACT), Ended(None), Ended(None)], roles,
                                      0.01, going_on=1, cut=lambda: [2]) == supervise.Left(
        [(1, supervise.CUT_OFF)])
    assert supervise.supervise_client([Ended(None), Ended(None), Ended(1)], roles, 0.01,
                                      going_on=1, cut=lambda: [2]) == supervise.Left(
        [(1, supervise.CUT_OFF)])  # It noticed first, and ended.
    assert supervise.supervise([Ended(LOST_CONTACT), Ended(None)], 0.01, 1, going_on=1,
                               cut=lambda: [1]) == supervise.Left([(1, supervise.CUT_OFF)])
    # The client's own host cut off: no server is lost, the run ends with the client's code.
    for codes in ((LOST_CONTACT, None, None), (LOST_CONTACT, 1, None)):
        assert supervise.supervise_client([Ended(c) for c in codes], roles, 0.01, going_on=1,
                                          cut=lambda: [0]) == LOST_CONTACT
    # Too few left without the hung or cut-off one: the group ends with its peers' code.
    monkeypatch.setattr(supervise, "HUNG_SETTLE", 0.2)
    assert supervise.supervise([Ended(LOST_CONTACT), Ended(None)], 0.01, 1, going_on=2,
                               cut=lambda: [1]) == LOST_CONTACT
    assert supervise.supervise([Ended(LOST_CONTACT), Ended(None)], 0.01, 1,
                               going_on=2) == LOST_CONTACT
    assert Group((1, 2), 0, "1:2").lose([(1, supervise.CUT_OFF)]) == [
        "tfdp.launch: worker 1 left (its host's link is down); going on with 1 of "
        "--num_workers=1:2: the group re-forms from the newest backup every worker has, at the "
        "same global batch"]
    # The client itself killed: lost where the group may start it again, and only killed (a
    # signal's code: an exit of its own, an error, ends the run).
    again = lambda *codes: supervise.supervise_client(  # noqa: E731
        [Ended(c) for c in codes], roles, 0.01, going_on=1, chief_again=True)
    assert again(-9, None, None) == supervise.ChiefLost(-9)
    assert again(1, None, None) == 1 and again(PREEMPTED, None, None) == PREEMPTED
    assert watch(-9, None, None) == supervise.exit_status(-9)  # No restarts left.
    restarted = Group((2, 2), 2, "2", client=True)
    assert restarted.start_the_chief_again(-9) == (
        "tfdp.launch: the chief left (exited with -9); starting it again (1/2 of "
        "--max_restarts): the group of 2 re-forms from the chief's newest backup")
    assert (restarted.restarts_left, restarted.size) == (1, 2)


def test_a_group_starts_lost_workers_again_while_it_may_goes_on_with_fewer_and_grows():
    group = Group((2, 3), 1, "2:3")
    assert group.goes_on and group.survivors_needed() == 1 and not group.departed
    two_at_once = group.lose([(0, -9), (2, 1)])  # One started again, one gone: 2 left.
    assert group.size == 2 and group.departed and group.survivors_needed() == 2
    assert two_at_once[0].endswith("starting it again (1/1 of --max_restarts): the group of 2 "
                                   "re-forms from the newest backup every worker has")
    assert two_at_once[1].startswith("tfdp.launch: worker 2 left (exited with 1); going on "
                                     "with 2 of --num_workers=2:3: ")
    room, line = group.joining()
    assert room and line.endswith("the group re-forms from it with 3 of --num_workers=2:3")
    group.grow()
    assert (group.size, group.departed) == (3, False)
    assert group.joining() == (False, "tfdp.launch: a worker asked to join (SIGUSR1); the group "
                                      "has --num_workers=2:3's 3 already")
    assert Group((3, 3), 2, "3").survivors_needed() == 1  # A fixed group that restarts.
    assert not Group((3, 3), 0, "3").goes_on


def test_a_stop_for_a_join_says_the_launcher_re_forms_the_group_and_any_other_to_run_again(
        tmp_path, monkeypatch):
    """The line of a worker stopped while its run folder is marked for a join (what the
    launcher does before its SIGTERM), in an elastic group; without the mark, or outside a
    group that goes on, the stop is a preemption the user resumes."""
    from tfdp.training.backups import Backups
    from tfdp.training.preemption import Watch

    run_dir = str(tmp_path / "run")
    watch = Watch()
    watch.backups, watch.signal = Backups(run_dir, 0, {}), "SIGTERM"
    again = "; run the same command again to resume"
    monkeypatch.setenv("TFDP_GROUP_GOES_ON", "--num_workers=1:3")
    assert str(watch.preempted(12, "saved-here")).endswith(again)
    regrouping.mark(run_dir)
    assert str(watch.preempted(12, "saved-here")) == (
        "preempted (SIGTERM) at step 12: state of step 12 saved in saved-here; a worker joins: "
        "tfdp.launch --num_workers=1:3 re-forms the group from it, one larger")
    monkeypatch.delenv("TFDP_GROUP_GOES_ON")
    assert str(watch.preempted(12, "saved-here")).endswith(again)
    regrouping.unmark(run_dir)
    regrouping.unmark(run_dir)  # Gone already: nothing to do.
    assert not os.listdir(run_dir)


def test_the_workers_still_running_when_the_others_lost_contact_with_them_are_hung(
        monkeypatch):
    """Every worker that ended lost contact with a peer, and one still runs: it hung past their
    watchdog (stopped, or stuck), and is the one the group goes on without. If it ends likewise
    in the meantime, the whole group lost contact: not a hang."""
    from tfdp.launcher import supervise
    from tfdp.util.errors import LOST_CONTACT_EXIT_CODE as LOST_CONTACT

    monkeypatch.setattr(supervise, "HUNG_SETTLE", 0.3)

    class Worker:
        def __init__(self, codes):
            self.codes = list(codes)

        def poll(self):
            return self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]

    group = [Worker([LOST_CONTACT]), Worker([None]), Worker([None, LOST_CONTACT])]
    assert supervise.supervise(group, 0.01, 1.0, going_on=1) == supervise.Left([(1, None)])
    group = [Worker([LOST_CONTACT]), Worker([None, None, LOST_CONTACT])]
    assert supervise.supervise(group, 0.01, 1.0, going_on=1) == LOST_CONTACT


def _kill_a_worker(run, chosen, size: int, how=signal.SIGKILL) -> int:
    """SIGKILL (or stop: ``how``) a random one of the group's ``size`` workers: its index."""
    workers = {task_of["task"]["index"]: pid for pid in children(run.pid)
               if (task_of := tf_config_of(pid))}
    assert sorted(workers) == list(range(size)), workers
    victim = chosen.choice(sorted(workers))
    os.kill(workers[victim], how)
    return victim


@pytest.mark.parametrize("launcher, train, line", [
    (["--num_workers=3:2"], ["--strategy=multi_worker"],
     "--num_workers=3:2: the workers must be a positive integer, or MIN:MAX with 1 <= MIN <= MAX"),
    (["--num_workers=1:2"], ["--strategy=parameter_server"],
     "--num_workers=1:2 re-forms a --strategy=manual or multi_worker group; "
     "--strategy=parameter_server: a lost worker is started again already; give a number"),
    (["--num_workers=1:2"], ["--strategy=multi_worker", "--per_replica_batch_size=32"],
     "--num_workers=1:2 keeps the global batch whatever the group's size, so that the model is "
     "the same: give the workers --batch_size (the global batch) instead of "
     "--per_replica_batch_size"),
    (["--num_workers=1:2"], ["--strategy=multi_worker", "--backup_every=0"],
     "--num_workers=1:2 re-forms the group from the newest backup: --backup_every=0 would redo "
     "whole epochs; give it steps or seconds"),
    (["--num_workers=2", "--max_restarts=1"], ["--strategy=parameter_server"],
     "--max_restarts=1 re-forms a --strategy=manual or multi_worker group; "
     "--strategy=parameter_server: a lost worker is started again already; leave "
     "--max_restarts out"),
    (["--num_workers=1:2"], ["--strategy=manual", "--per_replica_batch_size=32"],
     "--num_workers=1:2 keeps the global batch whatever the group's size, so that the model is "
     "the same: give the workers --batch_size (the global batch) instead of "
     "--per_replica_batch_size"),
    (["--num_workers=2", "--max_restarts=2"], ["--strategy=multi_worker", "--backup_every=0"],
     "--max_restarts=2 re-forms the group from the newest backup: --backup_every=0 would redo "
     "whole epochs; give it steps or seconds"),
    (["--num_workers=2", "--max_restarts=-1"], ["--strategy=multi_worker"],
     "flag --max_restarts=-1: -1 is not a non-negative integer; see tfdp.launch --help"),
    (["--num_workers=1:2", "--max_restarts=1", "--hosts"], ["--strategy=multi_worker"],
     "--max_restarts=1 with --hosts: a worker whose emulated host is cut off cannot be started "
     "there again; leave --max_restarts out (MIN:MAX goes on without it)"),
])
def test_what_a_group_cannot_do_is_refused_in_one_line_before_anything_starts(launcher, train,
                                                                             line):
    done = run_module("tfdp.launch", *launcher, "--", *train, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"tfdp.launch: error: {line}", done.stderr


@pytest.mark.cluster
def test_the_bench_measures_what_a_group_costs_and_how_soon_it_trains_again(tmp_path, data_dir):
    """``python -m tfdp.bench --elastic`` (tiny sizes: not a timing test): groups of two that
    lose nothing, fixed and elastic, and an elastic one that loses a worker; the table and the
    JSON hold every figure, the times after the kill in the order they happen."""
    # Steps enough for a worker to be lost while the second epoch trains (an epoch of 8 small
    # ones ended before the kill).
    result = run_module("tfdp.bench", "--elastic", "--workers=2", "--rounds=1", "--steps=40",
                        "--epochs=2", "--batch_size=256", f"--data_dir={data_dir}",
                        f"--workdir={tmp_path}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    row, = json.loads((tmp_path / "elastic.json").read_text())
    assert row["path"] == "multi_worker"
    assert row["workers"] == 2 and row["rounds"] == 1 and len(row["runs"]) == 1
    assert row["fixed"] > 0 and row["elastic"] > 0, row
    assert 0 < row["to_left"] <= row["to_resumed"] <= row["to_training"] < 120, row
    assert 0 <= row["steps_again"] <= elastic.BACKUP_EVERY, row
    table = (tmp_path / "elastic.md").read_text()
    assert table.splitlines()[2].startswith(
        f"| multi_worker | 2 | {row['fixed']:.0f} | {row['elastic']:.0f} | ")


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
