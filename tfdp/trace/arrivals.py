"""Who reaches the gradient exchange when (section 12.3): stragglers named, and a flight recorder
for hangs.

Every step of the from-scratch path (``tfdp.paths.manual.step``) and of Keras ``fit`` under a
strategy (``tfdp.paths.keras.train_step``) stamps, on each replica's own device (so on its own
worker across machines), the time it starts and the time its gradients are ready to be
exchanged (``stamp_after``: ``tf.timestamp``, Unix seconds). The from-scratch loop reads every
step's times; ``fit`` every few steps (reading a step's results waits for it). From those:

* per replica, each epoch: its **compute** (ready - start) and its **wait** at the exchange (the
  last replica's ready - its own), averaged, go into the epoch's record in ``metrics.json``;
* a **straggler**, a replica that reaches the exchange last in at least ``LAST_SHARE`` of the
  epoch's steps, on average at least ``LATE_MS`` ms and ``LATE_SHARE`` of the median compute
  after the others, is named in the epoch's line ("worker 1 reaches the allreduce 38.0 ms after
  the others on average, last in 92% of steps"): two logical devices sharing two cores take
  turns by a few milliseconds, which is not what a straggler is;
* a **pause**, one step whose last replica reaches the exchange at least ``PAUSE_S`` seconds and
  ``PAUSE_SHARE`` times the median compute after the others (a worker stopped, swapping, or
  preempted and resumed for a while), is named with its step ("pause: worker 1 (replica 1)
  reached the allreduce 19.8 s after the others at step 57"), and the straggler rule judges the
  other steps: averaged in, one pause made a straggler of a worker that is not one; a worker
  that stops after its gradients are ready (in the exchange itself, where every replica waits
  alike) is named by the silence the cluster's probe heard instead (``silences``: the stall
  watchdog's, ``tfdp.cluster.stall``), with the step it held: "pause: worker 1 did not answer
  for 3.9 s at step 73";
* the **flight recorder** keeps the last ``flight_recorder.KEPT`` steps' times; when the
  cluster is lost (a peer dies, or a step outlasts ``--collective_timeout``), ``dump`` writes
  them to ``flight_recorder.json`` in the run folder and the one-line error names that file.

Across real machines the times come from each worker's clock: a worker whose clock runs ahead
by d looks d late. On one machine (``tfdp.launch``, emulated hosts) the clock is one.
"""

import collections
import re
import statistics

import numpy as np
import tensorflow as tf

from tfdp.trace import flight_recorder

LAST_SHARE = 0.6
LATE_MS = 2.0
LATE_SHARE = 0.25
PAUSE_S = 1.0
PAUSE_SHARE = 20.0


def stamp_after(pred, deps: list, anchor):
    """The time, on this replica's device and clock, once ``deps`` exist (``pred``: any boolean
    scalar computed from them, true or not).

    ``tf.function`` runs stateful ops that take no resource (a bare ``tf.timestamp``) one after
    the other in program order, so replica 1's stamp would wait for replica 0's gradients; a
    stamp inside a replica's own cond would hold back every output of the cond until the last
    (a branch's outputs wait for its stateful ops), and no allreduce could start early. Here the
    stamp is a cond of its own that reads ``anchor``, one of the replica's variables: ordered
    by that variable only, and after ``deps`` only."""
    def stamp():
        return tf.timestamp() + 0.0 * tf.cast(tf.reduce_sum(anchor.read_value()), tf.float64)

    with tf.control_dependencies(deps):
        return tf.cond(pred, stamp, stamp)


# Times folded into [0, PERIOD) s travel as float32 (about 0.06 ms apart at 1000 s), with the
# other float32 logs of a Keras step; ``unfold`` restores them near the host's clock.
PERIOD = 1000.0


def unfold(folded, now: float):
    """Unix times from ``folded`` (times modulo ``PERIOD``), taking those within ``PERIOD / 2``
    of ``now`` (a step's times, read seconds after it ran, on clocks that agree to much less)."""
    folded = np.asarray(folded, np.float64)
    return now - ((now - folded + PERIOD / 2) % PERIOD - PERIOD / 2)


def _late(ready: np.ndarray) -> np.ndarray:
    """[steps, replicas]: how much later than the others' mean each replica was ready."""
    k = ready.shape[1]
    return ready - (ready.sum(1, keepdims=True) - ready) / (k - 1)


def _silence(silence: tuple, numbers: list, started_ms: np.ndarray) -> str:
    """The epoch line's words for the longest ``silence``, at the last of the steps
    (``numbers``, first started at ``started_ms``) begun before it was first asked: the step it
    held, whatever phase it was in; else (heard before the epoch's first step) what was being
    done."""
    worker, asked, answered, doing = silence
    begun = np.flatnonzero(started_ms <= asked * 1e3)
    held = f"at step {numbers[begun[-1]]}" if len(begun) else f"while {doing}"
    return f"; pause: {worker} did not answer for {answered - asked:.1f} s {held}"


def replica_names(devices: list) -> list:
    """"worker 1 (replica 2)" across machines, "replica 2" on one."""
    names = []
    for d, device in enumerate(devices):
        task = re.search(r"/job:worker/(?:replica:\d+/)?task:(\d+)", device)
        names.append(f"worker {task.group(1)} (replica {d})" if task else f"replica {d}")
    return names


class Arrivals(flight_recorder.FlightRecorder):
    """The per-replica times of the steps read so far: this epoch's, and the last kept."""
    describes = "arrival times per replica"

    def __init__(self, devices: list, run_dir: str):
        self.devices, self.names = list(devices), replica_names(devices)
        self.run_dir = run_dir
        self.kept = collections.deque(maxlen=flight_recorder.KEPT)
        self.epoch = []
        # () -> the silences heard since the last call: [(worker, asked, answered, doing)],
        # Unix times; where the path probes its workers (``tfdp.cluster.stall.Stall.probe``).
        self.silences = list

    def add(self, step: int, times) -> None:
        """``times``: [replicas, 2] of (start, ready) Unix seconds, of global step ``step``."""
        times = np.asarray(times, np.float64)
        self.epoch.append((step, times))
        self.kept.append((step, times))

    def epoch_figures(self) -> tuple:
        """(the record's per-replica figures, the epoch line's words), and a new epoch."""
        numbers = [step for step, _ in self.epoch]
        steps, self.epoch = np.array([times for _, times in self.epoch]), []
        if not len(steps):
            return {}, ""
        start, ready = steps[:, :, 0] * 1e3, steps[:, :, 1] * 1e3
        compute = (ready - start).mean(0)
        if ready.shape[1] < 2:
            return {"replica_compute_ms": compute.round(3).tolist(), "replicas": self.names}, ""
        wait = (ready.max(1, keepdims=True) - ready).mean(0)
        late = _late(ready).mean(0)
        figures = {"replica_compute_ms": compute.round(3).tolist(),
                   "replica_wait_ms": wait.round(3).tolist(),
                   "replica_late_ms": late.round(3).tolist(), "replicas": self.names}
        words = ""
        ordered = np.sort(ready, axis=1)
        behind = ordered[:, -1] - ordered[:, -2]  # The last replica after the one before it.
        i = int(behind.argmax())
        typical = float(np.median(ready - start))  # A step's compute, the pause aside.
        silences = self.silences()
        if behind[i] >= max(PAUSE_S * 1e3, PAUSE_SHARE * typical):
            words = (f"; pause: {self.names[int(ready[i].argmax())]} reached the allreduce "
                     f"{behind[i] / 1e3:.1f} s after the others at step {numbers[i]}")
            # A straggler is late in the other steps too.
            start, ready = np.delete(start, i, axis=0), np.delete(ready, i, axis=0)
            if not len(ready):
                return figures, words
        elif silences:
            words = _silence(max(silences, key=lambda s: s[2] - s[1]), numbers, start.min(1))
        late = _late(ready).mean(0)
        # The record's lateness is the straggler's: the pause, named on its own, aside (one
        # step of the chief's epoch-end work outweighed a worker slowed through the epoch).
        figures["replica_late_ms"] = late.round(3).tolist()
        last = np.bincount(ready.argmax(1), minlength=ready.shape[1]) / len(ready)
        r = int(late.argmax())
        bar = max(LATE_MS, LATE_SHARE * statistics.median((ready - start).mean(0).tolist()))
        if last[r] >= LAST_SHARE and late[r] >= bar:
            words = (f"; straggler: {self.names[r]} reaches the allreduce {late[r]:.1f} ms "
                     f"after the others on average, last in {last[r]:.0%} of steps") + words
        return figures, words

    def dump(self, why: str = "") -> str:
        """Write the last steps' times to the flight recorder file; return its path ('' when
        none were read)."""
        if not self.kept:
            return ""
        steps = []
        for step, times in self.kept:
            ready = times[:, 1]
            steps.append({"step": step, "replicas": [
                {"replica": name, "device": device, "start_unix_s": float(t[0]),
                 "ready_unix_s": float(t[1]), "after_first_ms": float((t[1] - ready.min()) * 1e3)}
                for name, device, t in zip(self.names, self.devices, times)]})
        return flight_recorder.write(self.run_dir, {
            "why": why, "note": "per replica, the Unix times each step started and its "
            "gradients were ready for the allreduce, on the replica's own clock",
            "steps": steps})
