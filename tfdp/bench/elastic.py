"""``python -m tfdp.bench --elastic``: what a group of ``tfdp.launch --num_workers=MIN:MAX``
costs (``tfdp.launcher.elastic``).

  python -m tfdp.bench --elastic --workers=2,3 --rounds=3
  python -m tfdp.bench --elastic --elastic_paths=multi_worker,manual

For each path of ``--elastic_paths`` (``multi_worker``'s workers, or the from-scratch client's
``tfdp.server`` workers) and worker count k of ``--workers``, in interleaved rounds, three
real launches (``--model``, ``--batch_size``, ``--steps`` per epoch, ``--epochs``,
``--backup_every=10``):

* **nothing lost**, launched as ``--num_workers=k`` and as ``--num_workers=1:k``: examples/s
  from each run's ``metrics.json`` (the epochs after the first), and the elastic group's
  relative to the fixed one's;
* **a worker lost**: one of ``--num_workers=1:k``'s workers (a server, on the from-scratch
  path), chosen at random, SIGKILLed as the chief's live progress line (asked for with ``TFDP_LIVE_PROGRESS``) reaches a random step of
  the second epoch; the seconds from the kill to the launcher's line that it left, to the
  re-formed group's resume line and to its first step trained (its first progress line), and
  the steps trained again (at least: the last step the line showed before the kill minus the
  one resumed at).

Medians over the rounds, written as elastic.md and .json in ``--workdir``. Beside them, for
``multi_worker`` (``--elastic_step_rounds``, 0: not measured), what its workers do more each
step in an elastic group, by CPU per example in a process of its own
(``tfdp.bench.whole_step_cost``): the launches' examples/s spread too much here to show a few
percent.
"""

import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from tfdp.bench.results import write_table
from tfdp.config.settings import LIVE_PROGRESS_ENV
from tfdp.util.errors import UserError

BACKUP_EVERY = 10  # Steps: what a loss can make the group train again.
PATHS = ("multi_worker", "manual")  # The paths whose groups re-form (``Path.regroups``).
# Whose lines report the run: worker 0's, or the from-scratch client's.
_REPORTER = {"multi_worker": "[0]", "manual": "[chief]"}
_LEFT = re.compile(r"^tfdp\.launch: worker \d+ left ")


def _progress(path: str):
    return re.compile(rf"^{re.escape(_REPORTER[path])} epoch (\d+)/\d+ (\d+)/\d+ ")


def _resumed(path: str):
    return re.compile(rf"^{re.escape(_REPORTER[path])} resuming (?:at .*\(global step (\d+)\)|"
                      r"a run that finished)")


def main(flags) -> None:
    """``python -m tfdp.bench --elastic``: the table, written as elastic.md and .json in
    ``flags.workdir``."""
    say = lambda line: print(f"tfdp.bench: {line}", flush=True)  # noqa: E731
    try:
        rows = measure([int(k) for k in flags.workers if k.strip()], flags.rounds, flags,
                       say=say, paths=[p.strip() for p in flags.elastic_paths if p.strip()])
        if flags.elastic_step_rounds and any(r["path"] == "multi_worker" for r in rows):
            say(f"multi_worker's step with and without a survivor's marks, "
                f"{flags.elastic_step_rounds} rounds ...")
            marks = _step_cost(flags)
            for r in rows:
                if r["path"] == "multi_worker":
                    r["marks"] = marks
    except (UserError, ValueError) as e:
        sys.exit(f"tfdp.bench: error: {e}")
    os.makedirs(flags.workdir, exist_ok=True)
    table = format_rows(rows)
    write_table(os.path.join(flags.workdir, "elastic"), rows, table)
    print(f"{table}\n\nwritten in {flags.workdir}: elastic.md, .json")


def measure(workers: list, rounds: int, flags, say=print, paths=("multi_worker",)) -> list:
    """One row per path and worker count: the medians of ``rounds`` rounds (module doc)."""
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        raise UserError(f"--elastic_paths={','.join(paths)}: give {' or '.join(PATHS)} (the "
                        "paths whose groups re-form)")
    if not workers or min(workers) < 2:
        raise UserError(f"--workers={','.join(map(str, workers))}: an elastic group needs at "
                        "least 2 workers to lose one; give counts of 2 or more")
    if flags.epochs < 2 or flags.steps < 8:
        raise UserError("--elastic kills a worker in the second epoch: give --epochs=2 or more "
                        "and --steps=8 or more")
    chosen = random.Random()
    samples = {(path, k): [] for path in paths for k in workers}
    for round_ in range(rounds):
        for path, k in samples:
            say(f"round {round_ + 1}/{rounds}: {path}, {k} workers, fixed, elastic, and one "
                "lost ...")
            # Each first in every other round, so that neither gains from going first.
            asked = [str(k), f"1:{k}"][::-1 if round_ % 2 else 1]
            rates = {a: _throughput(_launch(a, flags, path)) for a in asked}
            samples[path, k].append(dict(fixed=rates[str(k)], elastic=rates[f"1:{k}"],
                                         **_loss(k, flags, chosen, path)))
    return [_row(path, k, runs) for (path, k), runs in samples.items()]


def _row(path: str, k: int, runs: list) -> dict:
    def median(name):
        return statistics.median(run[name] for run in runs)

    row = {"path": path, "workers": k, "rounds": len(runs), "runs": runs}
    row.update({name: median(name) for name in ("fixed", "elastic", "to_left", "to_resumed",
                                                "to_training", "steps_again")})
    row["elastic_vs_fixed"] = statistics.median(run["elastic"] / run["fixed"] for run in runs)
    return row


def format_rows(rows: list) -> str:
    lines = ["| path | workers | fixed group, examples/s | `1:k` group, examples/s "
             "| `1:k` / fixed | kill to 'left', s | to 'resuming at', s | to its first step, s "
             "| steps trained again, at least |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['path']} | {r['workers']} | {r['fixed']:.0f} | {r['elastic']:.0f} | "
                     f"{r['elastic_vs_fixed']:.3f} | {r['to_left']:.1f} | "
                     f"{r['to_resumed']:.1f} | {r['to_training']:.1f} | "
                     f"{r['steps_again']:.0f} |")
    rounds = rows[0]["rounds"] if rows else 0
    text = ("\n".join(lines) + f"\n\nMedians of {rounds} round(s); a loss: one worker "
            f"SIGKILLed in the second epoch, backups every {BACKUP_EVERY} steps.")
    marks = next((r["marks"] for r in rows if "marks" in r), None)
    if marks:
        low, high = marks["ratio_range"]
        text += (f"\n\n`multi_worker`'s step in an elastic group (the marks of a survivor's "
                 f"step), {marks['model']}, global batch {marks['batch_size']}, 2 replicas in "
                 f"one process: {marks['marked_us']:.0f} CPU-microseconds an example against "
                 f"{marks['plain_us']:.0f} (medians: {marks['medians_ratio']:.3f}); the rounds' "
                 f"ratios {marks['ratio']:.3f} ({low:.3f}-{high:.3f}, {marks['rounds']} "
                 "rounds).")
    return text


def _command(asked: str, flags, workdir: str, path: str) -> list:
    train = [f"--strategy={path}", f"--model={flags.model}",
             f"--batch_size={flags.batch_size}", f"--steps_per_epoch={flags.steps}",
             f"--epochs={flags.epochs}", "--eval_steps=1", "--init=glorot",
             f"--backup_every={BACKUP_EVERY}", f"--workdir={workdir}/run",
             f"--export_dir={workdir}/export"]
    train += [f"--data_dir={flags.data_dir}"] * bool(flags.data_dir)
    train += [f"--manual_dir={flags.manual_dir}"] * bool(flags.manual_dir)
    return [sys.executable, "-m", "tfdp.launch", f"--num_workers={asked}", "--", *train]


def _step_cost(flags) -> dict:
    """``tfdp.bench.whole_step_cost``'s figures, measured in a process of its own (its two
    logical devices are set before TensorFlow starts)."""
    done = subprocess.run([sys.executable, "-m", "tfdp.bench.whole_step_cost",
                           f"--rounds={flags.elastic_step_rounds}", f"--steps={flags.steps}",
                           f"--batch_size={flags.batch_size}", f"--model={flags.model}"],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise UserError(f"measuring the step's marks failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _launch(asked: str, flags, path: str) -> dict:
    """The metrics.json of one launch that loses nothing."""
    workdir = tempfile.mkdtemp(prefix="tfdp-bench-elastic-")
    try:
        done = subprocess.run(_command(asked, flags, workdir, path), capture_output=True,
                              text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        _check(done.returncode, done.stderr, asked)
        with open(os.path.join(workdir, "run", "metrics.json")) as f:
            return json.load(f)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _throughput(metrics: dict) -> float:
    timed = metrics["epochs"][1:]  # The first: tracing, warm-up.
    return sum(e["examples"] for e in timed) / sum(e["seconds"] for e in timed)


def _loss(k: int, flags, chosen, path: str) -> dict:
    """A launch of ``1:k`` on ``path`` that loses a random worker at a random step of the
    second epoch: the seconds from the kill to each sign of the group going on, and the steps
    trained again."""
    progress, resumed_line = _progress(path), _resumed(path)
    workdir = tempfile.mkdtemp(prefix="tfdp-bench-elastic-")
    run = subprocess.Popen(_command(f"1:{k}", flags, workdir, path), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                    **{LIVE_PROGRESS_ENV: "1"}))
    seen = []  # (time, one line or one redraw of the progress line)
    reader = threading.Thread(target=_read, args=(run.stdout, seen), daemon=True)
    reader.start()
    try:
        target = chosen.randrange(flags.steps // 4, 3 * flags.steps // 4)
        _wait(seen, reader, lambda piece: (m := progress.match(piece)) and
              (int(m[1]), int(m[2])) >= (2, target))
        os.kill(chosen.choice(_workers(run.pid)), signal.SIGKILL)
        killed, start = time.monotonic(), len(seen)
        # The last step the progress line showed before the kill: reached, at least.
        step = flags.steps + max(int(m[2]) for _, piece in seen[:start]
                                 if (m := progress.match(piece)) and m[1] == "2")
        _, left, _ = _wait(seen, reader, _LEFT.match, start)
        index, resumed, line = _wait(seen, reader, resumed_line.match, start)
        if not resumed_line.match(line)[1]:
            raise UserError(f"--elastic: the worker was lost after the last step: --steps="
                            f"{flags.steps} pass too fast here to lose one in training; give "
                            "more --steps, or a larger --batch_size")
        _, training, _ = _wait(seen, reader, progress.match, index + 1)
        _check(run.wait(), "".join(piece + "\n" for _, piece in seen), f"1:{k}")
        return dict(to_left=left - killed, to_resumed=resumed - killed,
                    to_training=training - killed,
                    steps_again=max(0, step - int(resumed_line.match(line)[1])))
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _read(stream, seen: list) -> None:
    pending = b""
    for chunk in iter(lambda: os.read(stream.fileno(), 4096), b""):
        pending += chunk
        *pieces, pending = re.split(rb"[\r\n]", pending)
        now = time.monotonic()
        seen.extend((now, p.decode(errors="replace")) for p in pieces if p.strip())


def _wait(seen: list, reader, matches, start: int = 0, seconds: float = 600) -> tuple:
    """(index, time, piece) of the first piece of ``seen[start:]`` that ``matches``; a
    one-line error if the launch's output ends first (``reader`` has read it all)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        read_all = not reader.is_alive()
        for index in range(start, len(seen)):
            if matches(seen[index][1]):
                return (index, *seen[index])
        if read_all:
            tail = "; ".join(piece for _, piece in seen[-3:])
            raise UserError(f"--elastic: the launch ended before what it waited for: {tail}")
        time.sleep(0.01)
    raise UserError(f"--elastic: nothing came within {seconds:g} s")


def _workers(launcher: int) -> list:
    """The pids of the launcher's workers: its children whose TF_CONFIG task is a ``worker``
    (``multi_worker``'s, or the from-scratch client's servers; not the client)."""
    with open(f"/proc/{launcher}/task/{launcher}/children") as f:
        pids = [int(c) for c in f.read().split()]
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                variables = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            if json.loads(variables[b"TF_CONFIG"])["task"]["type"] == "worker":
                found.append(pid)
        except (OSError, KeyError, ValueError):
            continue
    return found


def _check(code: int, output: str, asked: str) -> None:
    if code != 0:
        tail = (output.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"--elastic: tfdp.launch --num_workers={asked} failed ({code}): {tail}")
