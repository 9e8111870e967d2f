"""Who is in an elastic group, agreed through the run folder, for the members of a Slurm step or
of a Kubernetes Indexed Job (``tfdp.launcher.managed_group``): no process of their own holds the
group, so the folder every task shares already (a re-formed group resumes from the backups in it)
holds its table too, one folder per job (``Table``):

* ``member-<id>.json``: a member's record (its agent's pid and host, the generation of the group
  it waits for or is in, whether its worker has finished the run), touched every ``BEAT``
  seconds while its agent lives;
* ``group-<g>.json``: generation g's members, in order, the first its chief, and their agents:
  written once, by whichever member makes it first (``os.link`` fails where the name exists:
  one writer wins, and every other member reads what it wrote);
* ``regroup-<g>``: group g stops for a member waiting to join; ``left-<id>-<g>``: member id
  leaves group g, stopped by a signal after saving its step; ``finished``: the run is done.

A member is lost when its record has not changed for ``LOST_AFTER`` seconds, as each member
measures on its own clock (the clocks of two machines, or a shared file system's times, need not
agree), when its record is gone, or when another agent's record has taken its place; never once
its worker has finished the run (its agent then ends, and its record stays)."""

import json
import os
import socket
import time
from typing import Optional

BEAT = 0.5  # Seconds between a member's touches of its record.
LOST_AFTER = 4.0  # Seconds without a touch after which a member is lost.


class Table:
    """The group table in ``folder`` as member ``me`` reads and writes it."""

    def __init__(self, folder: str, me: int, clock=time.monotonic):
        self.folder, self.me, self.clock = folder, me, clock
        self.seen = {}  # member -> (its record's stamp, my clock when the stamp last changed)
        self._agents = {}  # generation -> its members' agents (``agents``)
        self.last_beat = None
        os.makedirs(folder, exist_ok=True)

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def announce(self, wants: int, done: bool = False) -> None:
        """This member waits for group ``wants``, or is in it: its record, written whole or not
        at all; ``done``: its worker has finished the run."""
        record = {"pid": os.getpid(), "host": socket.gethostname(), "wants": wants,
                  "done": done}
        self._write(f"member-{self.me}.json", record, replace=True)
        self.last_beat = self.clock()

    def beat(self) -> None:
        """Touch this member's record, at most every ``BEAT`` seconds."""
        now = self.clock()
        if self.last_beat is None or now - self.last_beat >= BEAT:
            os.utime(self._path(f"member-{self.me}.json"))
            self.last_beat = now

    def members(self) -> dict:
        """The records of the members heard from within ``LOST_AFTER`` seconds, or done: id ->
        record."""
        now, live = self.clock(), {}
        for name in os.listdir(self.folder):
            if not (name.startswith("member-") and name.endswith(".json")):
                continue
            member = int(name[len("member-"):-len(".json")])
            try:
                stamp = os.stat(self._path(name)).st_mtime_ns
                with open(self._path(name)) as f:
                    record = json.load(f)
            except (OSError, ValueError):  # Gone, or being replaced: seen at the next look.
                continue
            before = self.seen.get(member)
            if before is None or before[0] != stamp:
                self.seen[member] = before = (stamp, now)
            if member == self.me or record["done"] or now - before[1] < LOST_AFTER:
                live[member] = record
        return live

    def departures(self, members, generation: int) -> tuple:
        """Those of group ``generation``'s ``members`` (ids) that have gone: (lost: not heard
        from within ``LOST_AFTER`` seconds, or another agent's record in their place, as when a
        pod replaced waits to join; leaving: asked to stop, and saving their step). A member
        gone on to a later group is neither: it saw a departure that this member sees too."""
        live, agents = self.members(), self.agents(generation)
        leaving = [m for m in members if os.path.exists(self._path(f"left-{m}-{generation}"))]
        lost = [m for m in members if m not in leaving and (
            m not in live or [live[m]["host"], live[m]["pid"]] != agents[str(m)])]
        return lost, leaving

    def leave_group(self, generation: int) -> None:
        """This member leaves group ``generation`` once its worker has saved its step."""
        self._write(f"left-{self.me}-{generation}", {}, replace=False)

    def agents(self, generation: int) -> dict:
        """The agent of each member of group ``generation`` as it was made: id -> [host, pid]
        (read once: a group is written once)."""
        if generation not in self._agents:
            with open(self._path(f"group-{generation}.json")) as f:
                self._agents[generation] = json.load(f)["agents"]
        return self._agents[generation]

    def group(self, generation: int) -> Optional[list]:
        """Group ``generation``'s members in order, once one member has made it; else None."""
        try:
            with open(self._path(f"group-{generation}.json")) as f:
                return json.load(f)["members"]
        except FileNotFoundError:
            return None

    def newest(self) -> int:
        """The newest generation made (-1 before the first)."""
        made = [int(n[len("group-"):-len(".json")]) for n in os.listdir(self.folder)
                if n.startswith("group-") and n.endswith(".json")]
        return max(made, default=-1)

    def make(self, generation: int, members: list) -> list:
        """Group ``generation`` of ``members`` (with their agents as their records name them),
        unless another member made it first: the group as made."""
        records = self.members()
        agents = {str(m): [records[m]["host"], records[m]["pid"]] for m in members}
        self._write(f"group-{generation}.json", {"members": members, "agents": agents},
                    replace=False)
        return self.group(generation)

    def ask_regroup(self, generation: int) -> None:
        self._write(f"regroup-{generation}", {}, replace=False)

    def regrouping(self, generation: int) -> bool:
        return os.path.exists(self._path(f"regroup-{generation}"))

    def finish(self) -> None:
        self._write("finished", {}, replace=False)

    def finished(self) -> bool:
        return os.path.exists(self._path("finished"))

    def leave(self) -> None:
        try:
            os.remove(self._path(f"member-{self.me}.json"))
        except FileNotFoundError:
            pass

    def _write(self, name: str, content: dict, replace: bool) -> None:
        """``name`` with ``content``, whole: replacing what is there, or only where nothing is."""
        temporary = self._path(f".{name}.{self.me}.{os.getpid()}")
        with open(temporary, "w") as f:
            json.dump(content, f)
        try:
            if replace:
                os.replace(temporary, self._path(name))
                return
            try:
                os.link(temporary, self._path(name))
            except FileExistsError:
                pass
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
