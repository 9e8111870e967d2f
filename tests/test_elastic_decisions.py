"""What the launcher of an elastic group decides (``tfdp.launcher.elastic``,
``tfdp.launcher.supervise``), on fake processes: who is lost and who survives a loss, a hang, a
cut-off host or a killed client; the lines it says; a join's stop told from a preemption; and
the one-line refusals of what a group cannot do. The groups themselves, real processes under real
signals: tests/test_elastic.py."""

import os
import re
import subprocess
import time
from types import SimpleNamespace

import pytest
from processes import run_module
from tfdp.launcher import elastic, regrouping
from tfdp.launcher.elastic import Group


class Ended:
    """A process seen by the launcher: ``code`` (None while it runs) at every look."""

    def __init__(self, code):
        self.code = self.returncode = code

    def poll(self):
        return self.code

    def wait(self, timeout=None):
        if self.code is None:
            raise subprocess.TimeoutExpired("a process that still runs", timeout)
        return self.code


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

    roles = [SimpleNamespace(role=r) for r in ("chief", "worker 0", "worker 1")]
    monkeypatch.setattr(supervise, "CLIENT_SAVES_WITHIN", 0.01)
    watch = lambda *codes, going_on=1: supervise.supervise_client(  # noqa: E731
        [Ended(c) for c in codes], roles, 0.01, going_on=going_on)
    assert watch(None, None, -9) == supervise.Left([(1, -9)])
    # A client still stepping is given its time to save what the surviving replicas hold.
    waited = []

    class Saving(Ended):
        def wait(self, timeout=None):
            waited.append(timeout)
            self.code = LOST_CONTACT
            return self.code

    assert supervise.supervise_client([Saving(None), Ended(None), Ended(-9)], roles, 0.01,
                                      going_on=1) == supervise.Left([(1, -9)])
    assert waited == [supervise.CLIENT_SAVES_WITHIN]
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


def test_a_server_ended_just_before_its_client_lost_contact_is_said(capsys):
    """A client that lost contact can end within one look of the launcher's (every 0.2 s) after
    the server it lost: that server's end is said still, before the client's; beside a client
    that ended otherwise, a server's end is not news."""
    from tfdp.launcher import supervise
    from tfdp.util.errors import LOST_CONTACT_EXIT_CODE as LOST_CONTACT

    roles = [SimpleNamespace(role=r) for r in ("chief", "worker 0", "worker 1")]
    assert supervise.supervise_client([Ended(LOST_CONTACT), Ended(None), Ended(-9)], roles,
                                      0.01) == LOST_CONTACT
    assert capsys.readouterr().err.splitlines() == [
        "tfdp.launch: worker 1 exited with -9 while the chief runs",
        f"tfdp.launch: the chief exited with {LOST_CONTACT}; stopping the workers"]
    assert supervise.supervise_client([Ended(1), Ended(None), Ended(-9)], roles, 0.01) == 1
    assert "worker 1" not in capsys.readouterr().err


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


def test_a_group_re_formed_after_a_loss_goes_on_from_the_newest_step_a_survivor_saved(tmp_path):
    """Every worker of the re-formed group gets the newest step a survivor saved as the step it
    held whole, whichever index it had; a survivor's other backups (an epoch's end, which a
    lost chief may not have recorded) and the lost worker's are never spread."""
    from tfdp.training.backups import Backups, resume_step
    from tfdp.training.state import TrainingState

    def save(worker, step, held=False):
        Backups(str(tmp_path), worker, {}).save(step, TrainingState([[float(step)]]), held)

    for worker in range(3):
        save(worker, 4)
    save(0, 7, held=True)
    save(2, 6, held=True)  # A step behind: its all-reduce had failed.
    save(1, 9, held=True)  # The lost worker's.
    save(2, 8)  # An epoch's end, say, the lost chief's record of which is not known.
    elastic.seed_from_the_survivors(str(tmp_path), [0, 2], 2)
    new = [Backups(str(tmp_path), i, {}) for i in range(2)]
    assert [b.steps() for b in new] == [[4, 7], [4, 7, 9]]
    assert resume_step(new[1], gather=lambda steps: [new[0].steps(), steps]) == 7
    assert new[1].load(7).weights[0].tolist() == [7.0]
    elastic.seed_from_the_survivors(str(tmp_path / "none"), [0], 2)  # No backup yet: nothing.
    assert not (tmp_path / "none").exists()


def test_a_group_re_formed_after_a_loss_or_a_join_says_how_soon_it_trains_again(
        monkeypatch, capsys):
    """The launcher hands each group it re-forms what it follows and when it saw it; the chief
    says so at its first steps, once; the first group, and the others' progress, say nothing."""
    from tfdp.config.settings import REGROUPED_ENV
    from tfdp.training.progress_line import Progress

    group, specs = Group((1, 3), 0, "1:3"), [SimpleNamespace(env={}) for _ in range(2)]
    group.tell_the_workers(specs)
    assert all(REGROUPED_ENV not in spec.env for spec in specs)  # The first group.
    group.lose([(1, -9), (2, -9)])
    group.tell_the_workers(specs)
    monkeypatch.setenv(REGROUPED_ENV, specs[1].env[REGROUPED_ENV])
    since, what = regrouping.after()
    # Written to the millisecond: it may be up to half of one after now.
    assert what == "workers 1 and 2 left" and -0.001 <= time.time() - since < 60, since
    started = time.time()
    progress = Progress("epoch 2/3", 40, live=False, regrouped=(started - 4.2, what))
    assert progress.wanted  # The Keras path reads the step's figures for it.
    progress.update(11, [("loss", 0.5)])
    waited = time.time() - started  # Seconds, on a busy machine.
    progress.update(12, [("loss", 0.5)])
    said = re.fullmatch(r"epoch 2/3, step 11/40: training again (\d+\.\d) s after workers 1 "
                        r"and 2 left\n", capsys.readouterr().out)
    assert said and 4.2 <= float(said[1]) <= round(4.2 + waited, 1) + 0.05, (said, waited)
    assert not progress.wanted
    assert group.joining()[0]
    group.tell_the_workers(specs := [SimpleNamespace(env={})])
    assert specs[0].env[REGROUPED_ENV].endswith(" a worker asked to join")
    monkeypatch.setenv(REGROUPED_ENV, "")
    assert regrouping.after() is None


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
    regrouping.mark(run_dir, regrouping.LEAVES)  # A managed group's member, its task stopped.
    assert str(watch.preempted(12, "saved-here")).endswith(
        "; a worker leaves: tfdp.launch --num_workers=1:3 re-forms the group from it, one smaller")
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
