"""How the agents of a managed elastic group (``tfdp.launcher.managed_group``) agree on each
group through the run folder's table (``tfdp.launcher.rendezvous``): who forms group N, who
waits to be taken in, and whether the others go on when this member's task is stopped."""

import time

from tfdp.launcher import elastic
from tfdp.launcher.output import say

SETTLE = 3.0  # Seconds a group of at least MIN, but fewer than MAX, waits for more to come.
GATHER = 120.0  # Seconds to wait for MIN members before the run stops.
ALONE = 1.0  # Seconds a stopped member watches for others leaving too (a whole job stopped).
POLL = 0.2


def form(table, generation: int, group, signals, run_dir: str):
    """Group ``generation``'s members (ids, in order), made with the others; None where fewer
    than MIN came within ``GATHER`` seconds, a signal came, or the run has finished."""
    table.announce(generation)
    started, counted, steady_since = time.monotonic(), None, time.monotonic()
    while not signals and not table.finished():
        made = table.group(generation)
        if made is not None:
            return made
        waiting = sorted(m for m, r in table.members().items() if r["wants"] == generation)
        if waiting != counted:
            counted, steady_since = waiting, time.monotonic()
        before = table.group(generation - 1) or []
        enough = (len(waiting) >= group.most or (
            len(waiting) >= group.fewest and time.monotonic() - steady_since >= SETTLE)) and (
            not still_coming(table, before, generation - 1))
        if enough and waiting[0] == table.me:
            members = table.make(generation, waiting[:group.most])
            if members[0] == table.me and generation:
                elastic.seed_from_the_survivors(
                    run_dir, [i for i, m in enumerate(before) if m in members], len(members))
                for position in range(len(before), len(members)):
                    elastic.seed_the_joiner(run_dir, position)
            return members
        if time.monotonic() - started > GATHER:
            say(f"tfdp.launch: {len(waiting)} of --num_workers={group.asked} came within "
                f"{GATHER:.0f} s, fewer than {group.fewest}: the run stops; the same command "
                "resumes it from the newest backup")
            return None
        table.beat()
        time.sleep(POLL)
    return None


def still_coming(table, before: list, generation: int) -> list:
    """The members of group ``generation`` (``before``) not lost and not leaving that have not
    yet come to the next: their workers still save the common step, or end."""
    if not before:
        return []
    lost, leaving = table.departures(before, generation)
    live = table.members()  # Read again: one gone since is no longer coming.
    return [m for m in before if m not in lost and m not in leaving
            and live.get(m, {}).get("wants") == generation]


def wait_to_join(table, generation: int, group, signals):
    """A member too late for group ``generation``: the generation that takes it in (made with
    it, or about to be, the group having stopped for it); None once the run has finished, or a
    signal came. Taken in without waiting for room, it may be the new group's chief: the group
    it joins follows its asking (``group.after``)."""
    said, asked = False, time.time()
    while not signals and not table.finished():
        current = table.newest()
        taken = current if table.me in (table.group(current) or []) else None
        if taken is None:
            if current >= generation:
                generation = current + 1
                table.announce(generation)
            taken = generation if table.regrouping(current) else None
        if taken is not None:
            group.after = None if said else group.after or (asked, "a worker asked to join")
            return taken
        if not said and len(table.group(current) or []) >= group.most:
            say(f"tfdp.launch: task {table.me} waits to join: the group has --num_workers="
                f"{group.asked}'s {group.most} already")
            said = True
        table.beat()
        time.sleep(POLL)
    return None


def others_go_on(table, others: list, generation: int, group) -> bool:
    """Whether the ``others`` of group ``generation`` go on without this member, whose task was
    stopped: at least MIN of them are left and none leaves too within ``ALONE`` seconds (a whole
    job stopped, ``scancel`` or every pod deleted, signals every task at once: the run stops)."""
    deadline = time.monotonic() + ALONE
    while True:
        lost, leaving = table.departures(others, generation)
        if leaving or len(others) - len(lost) < group.fewest:
            return False
        if time.monotonic() >= deadline:
            return True
        table.beat()
        time.sleep(POLL)
