"""How the agents of a Slurm step's or an Indexed Job's elastic group agree on it through the run
folder (``tfdp.launcher.rendezvous``, ``managed_forming``, ``managed_group``), without
processes: who is lost (on each member's own clock), that a group is made once whoever makes it,
that the members present form it, and the one-line refusals. The group under a real Slurm, a task
killed: tests/test_slurm.py."""

import json
import os
import threading

import pytest
from tfdp.config.settings import Config
from tfdp.launcher import managed_forming, managed_group, rendezvous
from tfdp.launcher.elastic import Group


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_member_is_lost_when_its_record_stops_changing_on_the_readers_clock(tmp_path):
    """Member 1 of group 0 is there while it beats; lost once its record has not changed for
    LOST_AFTER seconds of member 0's clock, whatever the file's own times say; never once it is
    done; neither lost nor leaving once gone on to group 1 itself; lost when another agent's
    record takes its place (a pod replaced, waiting to join), or its record is gone; leaving,
    not lost, once it has said it leaves the group."""
    clock = Clock()
    zero, one = (rendezvous.Table(str(tmp_path), me, clock) for me in (0, 1))
    zero.announce(0)
    one.announce(0)
    assert zero.make(0, [0, 1]) == [0, 1]
    assert sorted(zero.members()) == [0, 1] and zero.departures([1], 0) == ([], [])
    clock.now += rendezvous.LOST_AFTER - 0.5
    assert zero.departures([1], 0) == ([], [])
    path = tmp_path / "member-1.json"
    stamp = path.stat().st_mtime_ns
    one.beat()  # Its touch changes the record's time: heard from again.
    if path.stat().st_mtime_ns == stamp:  # A coarse clock: set it past the old one.
        os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    clock.now += 1.0
    assert zero.departures([1], 0) == ([], [])
    clock.now += rendezvous.LOST_AFTER
    assert zero.departures([1], 0) == ([1], [])
    one.announce(0, done=True)  # Its worker finished the run: its silence is no loss.
    clock.now += 10 * rendezvous.LOST_AFTER
    assert zero.departures([1], 0) == ([], [])
    one.announce(1)  # On to the next group: it saw a departure member 0 will see.
    assert zero.departures([1], 0) == ([], [])
    record = json.loads(path.read_text())
    path.write_text(json.dumps(dict(record, pid=record["pid"] + 1)))  # Another agent, task 1.
    assert zero.departures([1], 0) == ([1], [])
    one.leave()
    assert zero.departures([1], 0) == ([1], [])
    one.leave_group(0)
    assert zero.departures([1], 0) == ([], [1])


def test_a_group_is_made_once_whoever_makes_it(tmp_path):
    """Two members making generation 0 at once: both read the group the first wrote."""
    zero, one = (rendezvous.Table(str(tmp_path), me) for me in (0, 1))
    assert zero.newest() == -1
    zero.announce(0)
    one.announce(0)
    assert zero.make(0, [0, 1]) == [0, 1]
    assert one.make(0, [1]) == [0, 1]
    assert one.newest() == 0 and json.loads((tmp_path / "group-0.json").read_text())[
        "members"] == [0, 1]
    assert not one.regrouping(0) and not one.finished()
    zero.ask_regroup(0)
    zero.finish()
    assert one.regrouping(0) and one.finished()
    # Each written whole, through a temporary file that is gone.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "finished", "group-0.json", "member-0.json", "member-1.json", "regroup-0"]


@pytest.mark.parametrize("present,expected", [(3, [0, 1, 2]), (2, [0, 1])])
def test_the_members_present_form_the_group_all_at_once_or_at_least_min_after_settling(
        tmp_path, present, expected):
    """Agents of ``--num_workers=2:3`` forming group 0 in threads: all three form it at once;
    two wait ``SETTLE`` seconds for a third, then form it; every agent reads the same group."""
    made = {}

    def agent(me):
        table = rendezvous.Table(str(tmp_path), me)
        made[me] = managed_forming.form(table, 0, Group((2, 3), 0, "2:3"), [], str(tmp_path))

    threads = [threading.Thread(target=agent, args=(me,)) for me in range(present)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert made == {me: expected for me in range(present)}


def test_the_next_group_waits_for_the_members_of_the_last_still_saving(tmp_path):
    """After group 0 of three stops, the next waits for a member whose worker still saves (alive,
    not yet come on), not for one lost, one leaving, or one come on already."""
    clock = Clock()
    tables = [rendezvous.Table(str(tmp_path), me, clock) for me in range(4)]
    for table in tables[:3]:
        table.announce(0)
    tables[0].make(0, [0, 1, 2])
    tables[0].announce(1)
    assert managed_forming.still_coming(tables[0], [0, 1, 2], 0) == [1, 2]
    tables[2].leave_group(0)  # Stopped by a signal: it leaves once saved.
    assert managed_forming.still_coming(tables[0], [0, 1, 2], 0) == [1]
    clock.now += rendezvous.LOST_AFTER + 1  # Silent since: lost.
    tables[0].announce(1)
    assert managed_forming.still_coming(tables[0], [0, 1, 2], 0) == []


def test_what_a_managed_group_cannot_do_is_one_line():
    """Another path than multi_worker, the one-machine launcher's flags, or MAX beyond the
    manager's tasks: refused in one line naming what to change."""
    found = ("Slurm", {"worker": ["node1:1", "node1:2", "node2:1"]}, "worker", 0, "7")
    say = managed_group.refusal
    assert "re-forms --strategy=multi_worker groups, not --strategy=manual" in say(
        found, (1, 2), Config(strategy="manual"), False, 0)
    assert "leave them out" in say(found, (2, 3), Config(strategy="multi_worker"), True, 0)
    assert "Slurm started 3 task(s); MAX can be at most that" in say(
        found, (2, 4), Config(strategy="multi_worker"), False, 0)
    assert say(found, (2, 3), Config(strategy="multi_worker"), False, 0) == ""


def test_a_stopped_member_tells_the_others_go_on_only_when_it_leaves_alone(tmp_path, monkeypatch):
    """Member 2 of three (``--num_workers=2:3``), its task stopped: the others go on without it,
    unless another leaves too within ``ALONE`` seconds (a whole job stopped) or fewer than MIN
    would be left."""
    monkeypatch.setattr(managed_forming, "ALONE", 0.3)
    tables = [rendezvous.Table(str(tmp_path), me) for me in range(3)]
    for table in tables:
        table.announce(0)
    tables[0].make(0, [0, 1, 2])
    go_on = lambda group: managed_forming.others_go_on(tables[2], [0, 1], 0, group)  # noqa
    tables[2].leave_group(0)
    assert go_on(Group((2, 3), 0, "2:3"))
    assert not go_on(Group((3, 3), 0, "3:3"))
    tables[1].leave_group(0)
    assert not go_on(Group((2, 3), 0, "2:3"))


def test_a_survivors_worker_may_save_its_step_before_it_is_stopped(tmp_path, monkeypatch):
    """Member 1 of ``--num_workers=1:2`` lost: member 0's worker, still running, is let end by
    itself (it backs up the step it holds whole, exit 69) while its agent goes on beating, and
    stopped only once ``SURVIVORS_SAVE_WITHIN`` seconds have passed; the group re-forms."""
    import subprocess
    import sys
    import time

    from tfdp.launcher import elastic, supervise
    monkeypatch.setattr(supervise, "SURVIVORS_SAVE_WITHIN", 3.0)
    monkeypatch.setattr(rendezvous, "BEAT", 0.0)
    table = rendezvous.Table(str(tmp_path), 0)
    table.announce(0)
    lost = [(1, elastic.UNHEARD)]
    for seconds, code in ((0.5, 69), (60, -9)):
        worker = subprocess.Popen([sys.executable, "-c",
                                   f"import time; time.sleep({seconds}); raise SystemExit(69)"])
        record = tmp_path / "member-0.json"
        os.utime(record, ns=(0, 0))
        began = time.monotonic()
        assert managed_group._depart(table, [0, 1], lost, worker, Group((1, 2), 0, "1:2")) == (
            "regroup")
        took = time.monotonic() - began
        assert worker.returncode == code, (seconds, took)
        assert took > 0.5 if code == 69 else 3.0 <= took < 10, took  # 69: ended by itself.
        assert record.stat().st_mtime_ns > 0  # Beaten while it waited.
