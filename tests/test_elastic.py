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

import pytest
from processes import backed_up, launch, task_pid, tasks, wait_for
from same_model import serves_like_two_devices_never_interrupted
from tfdp.launcher import regrouping

STEPS = 32  # Steps per epoch, two epochs; backups every 4 steps.
SETTINGS = dict(precision="float64", epochs=2, steps_per_epoch=STEPS, batch_size=48, lr=0.1,
                eval_steps=1, seed=4)


@pytest.mark.cluster
def test_a_group_that_loses_and_takes_workers_goes_on_and_trains_the_same_model(
        tmp_path, data_dir, test_split):
    """Three workers of ``--num_workers=1:3 --max_restarts=1`` (16 examples each a step), and
    from outside: a SIGKILL to a random worker once every worker has backed up a random step of
    the first epoch (it is started again: the group stays three); a SIGSTOP to another at a
    later step (hung: the others' watchdog, --collective_timeout=10, gives up on it, and the
    group goes on with two, 24 examples each); SIGUSR1 to the launcher as they train (a worker
    joins: every worker saves one common step and the group of three resumes from it, nothing
    lost); a last SIGKILL at a moment chosen at random, a later step or as the last epoch's line
    is said (its final backup, the export; on with two). Each time the launcher says who left or
    joined and what the group does (the survivors' own lines say the launcher re-forms it, and
    worker 0 how soon the group trains again); the run
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
    time.sleep(chosen.uniform(0, 0.25))  # Within the steps to the next backup, or at it.
    lost = [_kill_a_worker(run, chosen, 3)]  # Started again.
    killed = time.monotonic()
    resumed = _resumed(run, out, 1)
    took = time.monotonic() - killed
    assert resumed >= seen, (seen, "".join(out)[-3000:])
    # Each survivor says which step it holds whole; the group goes on from the newest one
    # saved, else (none newer than the backups, an epoch's last) from the newest backup.
    held = _held("".join(out), [i for i in range(3) if i != lost[0]])
    kept = [step for step, said in held if said == ": saved"]
    assert not kept or resumed == max(kept), (held, resumed, _said("".join(out)))
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
            f"{moment}:\n{_said(text)}")
    assert re.search(r"^tfdp\.launch: a worker joins \(SIGUSR1\): every worker saves one common "
                     r"step, and the group re-forms from it with 3 of --num_workers=1:3$", text,
                     re.M), text[-3000:]
    saved = set(re.findall(r"^\[\d\] tfdp\.train: preempted \(SIGTERM\) at step (\d+): state of "
                           r"step \1 saved in \S+; a worker joins: tfdp\.launch --num_workers=1:3 "
                           r"--max_restarts=1 re-forms the group from it, one larger$", text, re.M))
    assert saved == {str(joined)}, (saved, joined, text[-3000:])  # Nothing lost by the join.
    # Worker 0 says how soon each group re-formed trains (the last may have had nothing left).
    for after in (f"worker {lost[0]} left", f"worker {lost[1]} left", "a worker asked to join"):
        _trained_again(text, "0", after)
    assert "run the same command again" not in text, text[-3000:]  # The launcher does.
    assert not (tmp_path / "run" / regrouping.MARK).exists()
    assert "global batch 48 = 24 + 24 per replica" in text, text[-3000:]
    survivors = re.findall(r"^\[\d\] tfdp\.train: error: lost contact .*$", text, re.M)
    assert survivors and all("the backup of step" in line and ": tfdp.launch --num_workers=1:3 "
                             "--max_restarts=1 re-forms the group" in line
                             for line in survivors), survivors
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [r["epoch"] for r in metrics["epochs"]] == [1, 2], _said(text)
    assert os.listdir(tmp_path / "export") == ["1"]
    assert not (tmp_path / "run" / "backup").exists()  # The departed workers' too.
    print(f"re-formed and resuming {took:.1f} s after the first loss, from step {resumed} (the "
          f"survivors held {held}); joined at step {joined}; the last at {moment}")

    _serves_like_two_devices_never_interrupted(
        tmp_path, data_dir, test_split, "mirrored", f"workers {lost} killed from step {seen}, one "
        f"joined at step {joined}, the last lost at {moment}")


@pytest.mark.cluster
def test_a_from_scratch_client_that_loses_a_server_goes_on_and_trains_the_same_model(
        tmp_path, data_dir, test_split):
    """The from-scratch path across machines, ``--num_workers=1:2``: its client and two
    ``tfdp.server`` workers of one device each, and from outside a SIGKILL to a random server
    a random moment after the client has backed up a random step of the first epoch: the
    client's step cannot finish without it, so the client saves the newest whole step the
    surviving server's replica holds, where it is newer than its newest backup, and the group
    re-forms with one server (48 examples a step on its one device) from it; then SIGUSR1
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
    time.sleep(chosen.uniform(0, 1))  # At a boundary, within a window of steps, or evaluating.
    lost = [_signal_a_server(run, chosen, signal.SIGKILL)]
    resumed = _resumed(run, out, 1, "chief")
    # The surviving server's replica says which step it holds whole, and the group goes on from
    # it where it is newer than the client's newest backup; or it is an epoch's last, lost while
    # evaluated, and the group goes on from the backup.
    text = "".join(out)
    held = re.findall(r"^\[chief\] the replica on \S+ holds step (\d+)(?:: saved|, no newer)",
                      text, re.M)
    epochs_end = re.findall(r"^\[chief\] the replica on \S+ holds step \d+, the end of epoch "
                            r"\d+ before its figures", text, re.M)
    assert len(held + epochs_end) == 1, text[-3000:]
    assert resumed == max([int(h) for h in held] + [seen]) if held else resumed >= seen, (
        seen, text[-3000:])
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
    # The group of two may be stopped before its first step: the first loss's line only.
    _trained_again(text, "chief", f"worker {lost[0]} left")
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
    _trained_again(text, "chief", "the chief left")
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
    servers = {index: pid for (kind, index), pid in tasks(run.pid).items() if kind == "worker"}
    assert sorted(servers) == [0, 1], servers
    victim = chosen.choice(sorted(servers))
    os.kill(servers[victim], how)
    return victim


def _serves_like_two_devices_never_interrupted(tmp_path, data_dir, test_split, strategy, what):
    serves_like_two_devices_never_interrupted(tmp_path / "export" / "1", tmp_path, data_dir,
                                              test_split.images[:256], strategy, SETTINGS, what)


def _held(text: str, survivors: list) -> list:
    """(step, what followed) of each of the ``survivors``' first line on the step it holds
    whole after a loss (``tfdp.training.survivors``): saved, no newer than the newest backup,
    or an epoch's last."""
    found = [re.search(rf"^\[{i}\] worker {i} holds step (\d+)(: saved|, no newer|, the end "
                       r"of epoch)", text, re.M) for i in survivors]
    assert all(found), (survivors, _said(text))
    return [(int(m[1]), m[2]) for m in found]


def _resumed(run, out: list, times: int, reporter: str = "0") -> int:
    """The global step the group resumed at the ``times``-th time it re-formed (as its
    ``reporter`` says it: worker 0, or the client's ``chief``)."""
    pattern = (rf"^\[{reporter}\] resuming (?:at epoch \d/2, step \d+/{STEPS} \(global step "
               r"|a run that finished training \()(\d+)")
    wait_for(lambda: len(re.findall(pattern, "".join(out), re.M)) >= times
             or run.poll() is not None, 300, "the group to re-form")
    found = re.findall(pattern, "".join(out), re.M)
    assert len(found) >= times, "".join(out)[-3000:]
    return int(found[times - 1])


def _said(text: str) -> str:
    """For a failure's message: the launcher's and the workers' error lines, then the end."""
    return "\n".join(re.findall(r"^(?:tfdp\.launch: |\[\d\] tfdp\.train: error: ).*$", text,
                                 re.M) + [text[-2000:]])


def _trained_again(text: str, reporter: str, after: str) -> float:
    """The seconds from what the launcher saw (``after``: "worker 1 left") to the re-formed
    group's first steps, as its ``reporter`` says them."""
    found = re.findall(rf"^\[{reporter}\] epoch \d/2, step \d+/{STEPS}: training again "
                       rf"(\d+\.\d) s after {after}$", text, re.M)
    assert found and 0 < float(found[0]) < 300, (after, text[-3000:])
    return float(found[0])


def _kill_a_worker(run, chosen, size: int, how=signal.SIGKILL) -> int:
    """SIGKILL (or stop: ``how``) a random one of the group's ``size`` workers: its index."""
    workers = {index: pid for (_, index), pid in tasks(run.pid).items()}
    assert sorted(workers) == list(range(size)), workers
    victim = chosen.choice(sorted(workers))
    os.kill(workers[victim], how)
    return victim
