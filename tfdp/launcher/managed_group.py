"""``tfdp.launch --num_workers=MIN:MAX`` run by every task of a Slurm step (``srun --no-kill``) or
every pod of a Kubernetes Indexed Job: this task's agent in an elastic ``multi_worker`` group.

No process of tfdp's own sees the whole group there, so every agent takes part in agreeing on it
(``tfdp.launcher.rendezvous``, through the run folder): the members present form group 0 (all
MAX, or at least MIN after ``managed_forming.SETTLE`` seconds); each agent starts its task's
``tfdp.train`` worker with that group's ``TF_CONFIG`` (its own address, the manager's, kept
whatever the group) and watches it and the others. When a member is lost (its task killed, its
node gone: nothing heard from its agent for ``rendezvous.LOST_AFTER`` seconds), the survivors'
workers back up the step each holds whole and end, or are stopped after
``supervise.SURVIVORS_SAVE_WITHIN`` seconds (TensorFlow cannot take a worker out of a
``MultiWorkerMirroredStrategy`` group in place), and the survivors form the next group without
it, which resumes from the newest step a survivor saved (``managed_forming.form`` copies it to
every member), as ``tfdp.launch``'s own groups do (``tfdp.launcher.elastic``), while at least
MIN are left; a member whose task is stopped
(SIGTERM) saves its step with the others first (``managed_forming.others_go_on`` tells the
workers' lines whether the others go on). A member that comes (a replaced pod, a task started
again) waits; the group's chief asks the group to save one common step and stop, as for a
preemption, and the next group takes it in, up to MAX, starting it from a copy of worker 0's
backup. The global batch stays the one given, and so does the data order: the model is the one
an uninterrupted run trains."""

import functools
import json
import os
import signal
import subprocess
import sys
import time
from typing import NamedTuple

from tfdp import paths
from tfdp.config.settings import GROUP_GOES_ON_ENV, RUN_STAMP_ENV
from tfdp.launcher import (elastic, managed_forming as forming, regrouping, rendezvous,
                           supervise)
from tfdp.launcher.children import prepare_child
from tfdp.launcher.output import say
from tfdp.util.errors import LOST_CONTACT_EXIT_CODE, PREEMPTED_EXIT_CODE, UserError

FOLDER = ".tfdp-group"  # In the run folder: the group's table, one folder per job.
TF_CONFIG = "TF_CONFIG"


class Task(NamedTuple):
    """What this task's worker is started from, whatever the group: every task's address (the
    manager's), the workers' flags, the environment, the run folder."""
    addresses: list
    train_args: list
    env: dict
    run_dir: str


def as_a_task(managed_task, size_range: tuple, asked: str, config, train_args: list,
              hosts: bool, max_restarts: int):
    """Where a cluster manager started this process (``managed_task(strategy, num_ps)``:
    ``tfdp.cluster.managed.described``; a ``TF_CONFIG`` set wins), its part in the group to the
    end (``run``), or 2 after a one-line refusal; None elsewhere."""
    try:
        found = None if os.environ.get(TF_CONFIG) else managed_task(config.strategy,
                                                                    config.num_ps)
    except UserError as e:
        say(f"tfdp.launch: error: {e}")
        return 2
    if not found:
        return None
    problem = refusal(found, size_range, config, hosts, max_restarts)
    if problem:
        say(f"tfdp.launch: error: {problem}")
        return 2
    return run(found, size_range, asked, config, train_args)


def refusal(found, size_range: tuple, config, hosts: bool, max_restarts: int) -> str:
    """What this launch cannot do in the manager's task ``found``
    (``tfdp.cluster.managed.described``), in one line ("" if nothing)."""
    manager, cluster, _, _, _ = found
    tasks = len(cluster.get("worker", []))
    asked = f"--num_workers={size_range[0]}:{size_range[1]}"
    if not paths.get(config.strategy).regroups or paths.get(
            config.strategy).cluster != paths.WORKERS:
        return (f"{asked} in a {manager} {'step' if manager == 'Slurm' else 'job'} re-forms "
                f"--strategy=multi_worker groups, not --strategy={config.strategy}")
    if hosts or max_restarts:
        return (f"--hosts and --max_restarts are the launcher's on one machine; in {manager} "
                f"the tasks are {manager}'s: leave them out")
    if size_range[1] > tasks:
        return (f"{asked}: {manager} started {tasks} task(s); MAX can be at most that")
    return ""


def run(found, size_range: tuple, asked: str, config, train_args: list) -> int:
    """This task's part in the group, to the end: 0 once the group has trained and exported;
    ``PREEMPTED_EXIT_CODE`` after a SIGTERM every worker saved for; else the worker's code, or
    ``LOST_CONTACT_EXIT_CODE`` where fewer than MIN are left."""
    manager, cluster, _, me, job = found
    addresses = cluster["worker"]
    step = "-".join(os.environ.get(v, "0") for v in ("SLURM_STEP_ID", "SLURM_RESTART_COUNT"))
    stamp = f"{manager.lower()}-{job}"
    run_dir = config.workdir or config.default_run_dir(os.environ.get(RUN_STAMP_ENV, stamp))
    table = rendezvous.Table(os.path.join(run_dir, FOLDER, f"{stamp}-{step}"), me)
    group = elastic.Group(size_range, 0, asked)
    signals = []
    previous = {s: signal.signal(s, lambda n, f: signals.append(n))
                for s in (signal.SIGTERM, signal.SIGINT)}
    env = dict(os.environ, **{RUN_STAMP_ENV: os.environ.get(RUN_STAMP_ENV, stamp),
                              GROUP_GOES_ON_ENV: f"--num_workers={asked}"})
    generation = table.newest() + 1
    if generation:  # A group trains already: this task joins it, and may become its chief.
        group.after = (time.time(), "a worker asked to join")
    try:
        while True:
            members = forming.form(table, generation, group, signals, run_dir)
            if members is None:
                return (0 if table.finished() else PREEMPTED_EXIT_CODE if signals else
                        LOST_CONTACT_EXIT_CODE)
            if me not in members:  # Late: wait to be taken in.
                generation = forming.wait_to_join(table, generation, group, signals)
                if generation is None:
                    return 0 if table.finished() else PREEMPTED_EXIT_CODE
                continue
            chief = members[0] == me
            if chief:
                regrouping.unmark(run_dir)  # Every worker of the last group has stopped.
            group.size = len(members)
            ended = _train(table, generation, members, Task(addresses, train_args, env, run_dir),
                           group, signals)
            if ended == "finished":
                table.announce(generation, done=True)
                if chief:
                    table.finish()
                    elastic.clear_departed(run_dir, len(members))
                return 0
            if isinstance(ended, int):
                return ended
            generation += 1
    finally:
        if not table.members().get(me, {}).get("done"):  # A finished member's record stays.
            table.leave()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _train(table, generation, members, task: Task, group, signals):
    """Run this member's worker in group ``generation``: "finished", "regroup" (a member lost,
    leaving or joining), or an exit code to end with."""
    me, position = table.me, members.index(table.me)
    others = [m for m in members if m != me]
    cluster = {"worker": [task.addresses[m] for m in members]}
    worker = subprocess.Popen(
        [sys.executable, "-m", "tfdp.train", *task.train_args],
        env=dict(task.env, **group.regrouped_env(), **{TF_CONFIG: json.dumps({
            "cluster": cluster, "task": {"type": "worker", "index": position}})}),
        preexec_fn=functools.partial(prepare_child, None, os.getpid(), None, 0))
    if position == 0:
        say(f"tfdp.launch: group {generation}: {len(members)} of --num_workers={group.asked} "
            f"(tasks {', '.join(map(str, members))}), task {me} the chief")
    joining, stopping = False, False
    try:
        while worker.poll() is None:
            table.beat()
            if signals and not stopping:  # Its worker saves its step with the others' first.
                stopping = True
                table.leave_group(generation)
                if forming.others_go_on(table, others, generation, group):  # Their lines say so.
                    regrouping.mark(task.run_dir, regrouping.LEAVES)
                worker.send_signal(signal.SIGTERM)
            # The others went on without this task (its agent stopped meanwhile, say): it
            # waits to join the group they formed.
            if table.newest() > generation and not stopping:
                return "regroup"
            lost, leaving = table.departures(others, generation)
            if lost and not stopping:
                return _depart(table, members, [(m, elastic.UNHEARD) for m in lost], worker,
                               group)
            if not (joining or stopping or leaving) and (table.regrouping(generation) or (
                    position == 0 and _asks_to_join(table, members, group))):
                joining = True
                if position == 0:
                    regrouping.mark(task.run_dir)
                    table.ask_regroup(generation)
                    say(group.joining()[1].replace("(SIGUSR1)", "(a task came)"))
                worker.send_signal(signal.SIGTERM)
            time.sleep(forming.POLL)
        code = worker.returncode
        if code == 0:
            return "finished"
        if stopping:
            return code if code >= 0 else 128 - code
        # A worker stopped by its peers: one lost, one that left after saving (a SIGTERM to
        # one worker stops all), or one joining (a SIGTERM early in a worker's start may end it
        # before it can save: the group then re-forms from the newest backup); a loss is seen
        # within LOST_AFTER.
        deadline = time.monotonic() + (0 if joining else rendezvous.LOST_AFTER + 1)
        while True:
            if table.newest() > generation:
                return "regroup"
            lost, leaving = table.departures(others, generation)
            if lost or leaving:
                return _depart(table, members, [(m, elastic.UNHEARD) for m in lost] +
                               [(m, elastic.STOPPED) for m in leaving], worker, group)
            if time.monotonic() >= deadline:
                break
            table.beat()
            time.sleep(forming.POLL)
        if joining:
            return "regroup"
        return code if code >= 0 else 128 - code
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def _asks_to_join(table, members, group) -> bool:
    """Whether a live task not in the group waits to come in, and the group has room."""
    return len(members) < group.most and any(m not in members for m in table.members())


def _depart(table, members, departed: list, worker, group):
    """Members ``departed`` ((id, why) each) have gone: this worker let end by itself within
    ``supervise.SURVIVORS_SAVE_WITHIN`` s if it still runs (a survivor backs up the step it
    holds whole, ``tfdp.training.survivors``), then stopped (its collectives wait for them),
    the lowest survivor's lines said; "regroup" while at least MIN are left, else the exit
    code."""
    deadline = time.monotonic() + supervise.SURVIVORS_SAVE_WITHIN
    while worker.poll() is None and time.monotonic() < deadline:
        table.beat()  # Its agent is there: the other survivors must not take it for lost.
        time.sleep(forming.POLL)
    if worker.poll() is None:
        worker.kill()
        worker.wait()
    group.size = len(members)
    lines = group.lose(departed)  # Workers named by their tasks.
    gone = {m for m, _ in departed}
    speaks = [m for m in members if m not in gone][0] == table.me
    if speaks:
        for line in lines:
            say(line)
    if group.size < group.fewest:
        if speaks:
            say(f"tfdp.launch: fewer than {group.fewest} of --num_workers={group.asked} left: "
                "the run stops; the same command resumes it from the newest backup")
        return LOST_CONTACT_EXIT_CODE
    return "regroup"
