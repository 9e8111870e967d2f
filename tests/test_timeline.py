"""--trace_steps (section 12.3): the traced steps' timeline, a lane per replica with forward,
backward and communication events in every traced step, as trace-event JSON, a PNG, and the
profiler's own data, which xprof's converter reads in a process that never imports tfdp."""

import contextlib
import json
import subprocess
import sys
import threading
import time

import pytest

from processes import child_env
from traces import lanes_by_step
from tfdp.config.settings import Config
from tfdp.trace import timeline
from tfdp.trace.tracer import Tracer
from tfdp.training import entry
from tfdp.util.errors import UserError

PNG = b"\x89PNG\r\n\x1a\n"


def traced(tmp_path, data_dir, strategy, **flags):
    settings = dict(strategy=strategy, num_gpus=2, batch_size=64, epochs=1, steps_per_epoch=6,
                    eval_steps=1, data_dir=data_dir, workdir=str(tmp_path / "run"),
                    export_dir=str(tmp_path / "exports"), trace_steps="3:4")
    settings.update(flags)
    entry.train(Config(**settings))
    return json.loads((tmp_path / "run" / "timeline.json").read_text())


@pytest.mark.parametrize("strategy, allreduce", [("manual", "ring"), ("mirrored", "add_n")])
def test_traced_steps_have_a_lane_per_replica_with_every_phase(tmp_path, data_dir, strategy,
                                                                allreduce):
    trace = traced(tmp_path, data_dir, strategy, allreduce=allreduce)
    found = lanes_by_step(trace)
    for step in (3, 4):
        for replica in (0, 1):
            classes = found[("chief", f"replica {replica}", step)]
            assert {"forward", "backward"} <= classes, (step, replica, classes)
        communication = set.union(*(found.get(("chief", lane, step), set())
                                    for lane in ("replica 0", "replica 1", "host")))
        assert "communication" in communication and "update" in communication
    assert {k[2] for k in found} == {3, 4}  # The traced steps only.
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert [e["name"] for e in steps] == ["step 3", "step 4"]
    assert (tmp_path / "run" / "timeline.png").read_bytes().startswith(PNG)
    # Both paths stamp when each replica starts and has its gradients (mirrored: at step 5,
    # the callback's check, of the 6).
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"][0]
    assert record["replicas"] == ["replica 0", "replica 1"]
    assert all(ms > 0 for ms in record["replica_compute_ms"]), record
    if strategy == "manual":  # Named by the parameter it updates, where there is one.
        assert {e["args"]["parameter"] for e in trace["traceEvents"] if e.get("cat") == "update"
                and "parameter" in e["args"]} == {f"{p}{i}" for p in "Wb" for i in (1, 2, 3, 4)}


def test_the_profile_opens_with_xprof_in_a_process_without_tfdp(tmp_path, data_dir):
    traced(tmp_path, data_dir, "manual")
    profile = timeline.newest_profile(str(tmp_path / "run" / "tensorboard"))
    assert "/tensorboard/plugins/profile/" in profile  # Where TensorBoard's profile tab looks.
    reader = ("import json, sys\n"
              "from xprof.convert import raw_to_tool_data\n"
              "data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], 'trace_viewer', {})\n"
              "events = json.loads(data)['traceEvents']\n"
              "assert 'tfdp' not in sys.modules\n"
              "print(sum(1 for e in events if e.get('name') == 'train'))\n")
    done = subprocess.run([sys.executable, "-c", reader, profile], capture_output=True,
                          text=True, env=child_env(), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "2"  # The two traced steps' markers.


def test_tracing_off_records_nothing_and_never_shortens_a_window(tmp_path, data_dir):
    entry.train(Config(num_gpus=2, batch_size=64, epochs=1, steps_per_epoch=3, eval_steps=1,
                        data_dir=data_dir, workdir=str(tmp_path / "run"),
                        export_dir=str(tmp_path / "exports")))
    run = tmp_path / "run"
    assert not (run / "timeline.json").exists() and not (run / "trace").exists()
    assert not (run / "tensorboard" / "plugins").exists()
    off, on = Tracer(None, str(run)), Tracer((5, 6), str(run))
    assert not off.on and off.room(0) >= 1 << 62
    assert [on.room(done) for done in (0, 3, 4, 5, 6)] == [4, 1, 1, 1, 1 << 62]


@pytest.mark.parametrize("value", ["0:3", "5:2", "x", "3:"])
def test_a_bad_trace_range_is_one_line(value):
    with pytest.raises(UserError, match=rf"^--trace_steps={value}: give A:B, the first and last "
                                        r"global step to trace"):
        Config(trace_steps=value)


def test_servers_record_long_enough_for_the_traced_steps_at_the_pace_seen():
    from tfdp.trace.server_capture import duration_ms

    assert duration_ms(None, 2) == 20000  # Tracing from the first steps: no pace seen yet.
    assert duration_ms(0.1, 2) == 2600  # Three times 2 steps of 0.1 s, and 2 s.
    tracer = Tracer((6, 7), "/nowhere", servers=[("worker 0", "127.0.0.1:1")])
    for done in (0, 3, 5):  # The first call compiles: the pace is timed from the second.
        assert tracer.room(done) == (5 if done == 0 else 2 if done == 3 else 1)
    assert tracer.paced[1] == 3 and tracer._seconds_per_step(5) is not None
    assert Tracer((2, 3), "/nowhere")._seconds_per_step(1) is None


class _EpochOver(Exception):
    pass


class _StepsFinishingLater:
    """Steps issued at once and finished one after another, ``seconds`` each, later (as
    parameter-server steps are: scheduled, then run by the workers); evaluating ends the test."""
    window, sync_every = 4, 1

    def __init__(self, seconds):
        self.seconds, self.finished = seconds, {}

    def batches(self, first_epoch, offset):
        return iter(range(1 << 20))

    def issue(self, batches, first_step, count):
        return first_step + 1

    def collect(self, step):
        import tensorflow as tf

        tf.reduce_sum(tf.ones([8]))  # An op for the traced steps' timeline.
        time.sleep(self.seconds)
        self.finished[step] = time.monotonic()
        return [(1.0, 1, 1)]

    def evaluate(self):
        raise _EpochOver

    def state(self):
        return None

    def epoch_figures(self):
        return {}, ""


class _Recording:
    """The servers' capture, seen from the loop: when it started and for how long."""
    servers = [("worker 0", "127.0.0.1:1")]

    def start(self, milliseconds):
        self.started, self.milliseconds = time.monotonic(), milliseconds

    def finish(self):
        return []


def test_servers_record_until_the_last_traced_step_even_when_steps_finish_after_issue(tmp_path):
    from types import SimpleNamespace

    from tfdp.training import loop

    tracer = Tracer((3, 4), str(tmp_path), servers=[("worker 0", "127.0.0.1:1")])
    tracer.servers = recording = _Recording()
    steps = _StepsFinishingLater(seconds=0.6)
    progress = SimpleNamespace(update=lambda *_: None)
    watch = SimpleNamespace(requested=False, reached=lambda step: None,
                            training=lambda step: contextlib.nullcontext())
    run = SimpleNamespace(trained=False, first_step=0, first_epoch=0, offset=0, stall=None,
                          plan=SimpleNamespace(epochs=1, steps_per_epoch=6), tracer=tracer,
                          reporter=SimpleNamespace(progress=lambda *_: progress), watch=watch,
                          backup_interval=SimpleNamespace(due=lambda step: False))
    with pytest.raises(_EpochOver):
        loop.train(run, steps)
    # Issuing took no time; the servers record the traced steps' finishing, and more.
    assert steps.finished[4] - recording.started <= recording.milliseconds / 1000, (
        steps.finished, recording.started, recording.milliseconds)
    assert steps.finished[2] < recording.started  # Untraced steps finish before it starts.


def test_arrivals_name_a_replica_only_when_it_is_consistently_and_clearly_late(tmp_path):
    from tfdp.trace.arrivals import Arrivals

    arrivals = Arrivals(["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"],
                        str(tmp_path))
    for step in range(1, 11):  # Worker 1 ready 20 ms after worker 0 in 9 steps of 10.
        late = 0.020 if step != 3 else -0.001
        arrivals.add(step, [[100.0, 100.010], [100.0, 100.010 + late]])
    figures, note = arrivals.epoch_figures()
    assert figures["replicas"] == ["worker 0 (replica 0)", "worker 1 (replica 1)"]
    assert figures["replica_compute_ms"] == pytest.approx([10.0, 27.9], abs=1e-3)
    assert note == ("; straggler: worker 1 (replica 1) reaches the allreduce 17.9 ms after the "
                    "others on average, last in 90% of steps")
    for step in range(11, 21):  # A millisecond apart, in turns: nobody is named.
        arrivals.add(step, [[100.0, 100.010 + 0.001 * (step % 2)], [100.0, 100.0105]])
    assert arrivals.epoch_figures()[1] == ""
    kept = json.loads(open(arrivals.dump("a test")).read())["steps"]
    assert [s["step"] for s in kept] == list(range(1, 21))


def test_arrivals_name_a_pause_with_its_step_and_not_as_a_straggler(tmp_path):
    from tfdp.trace.arrivals import Arrivals

    arrivals = Arrivals(["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"],
                        str(tmp_path))
    for step in range(61, 121):  # Taking turns by a millisecond; worker 1 stopped 4 s at 79.
        late = 4.0 if step == 79 else 0.001 * (step % 2)
        arrivals.add(step, [[100.0, 100.010], [100.0, 100.0105 + late]])
    assert arrivals.epoch_figures()[1] == ("; pause: worker 1 (replica 1) reached the allreduce "
                                           "4.0 s after the others at step 79")
    for step in range(121, 131):  # A straggler that also paused: both named.
        arrivals.add(step, [[100.0, 100.010], [100.0, 100.030 + (2.0 if step == 125 else 0)]])
    assert arrivals.epoch_figures()[1] == (
        "; straggler: worker 1 (replica 1) reaches the allreduce 20.0 ms after the others on "
        "average, last in 100% of steps; pause: worker 1 (replica 1) reached the allreduce 2.0 s "
        "after the others at step 125")
    # Worker 1 slowed through the epoch, and worker 0 4 s late at its first step (the chief's
    # epoch-end work, under load): the record's lateness is the straggler's, as the line's (its
    # mean over every step once made worker 0 the late one; a CI run failed on it).
    for step in range(131, 181):
        arrivals.add(step, [[100.0, 100.010 + (4.0 if step == 131 else 0)], [100.0, 100.040]])
    figures, note = arrivals.epoch_figures()
    assert note.startswith("; straggler: worker 1 (replica 1) reaches the allreduce 30.0 ms")
    assert figures["replica_late_ms"] == pytest.approx([-30.0, 30.0])


def test_a_pause_in_the_exchange_is_named_by_the_probes_silence_with_the_step_it_held(tmp_path):
    """Worker 1 stopped after its gradients were ready: every replica's stamps on time, the
    next step 4 s late for all; the stall watchdog's probe heard it silent."""
    from tfdp.trace.arrivals import Arrivals

    arrivals = Arrivals(["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"],
                        str(tmp_path))
    heard = [[("worker 1", 100.03, 100.5, "training step 73"),
              ("worker 1", 100.8, 103.9, "training step 73")]]
    arrivals.silences = lambda: heard.pop() if heard else []
    for step in range(61, 121):
        t = 100.0 + 0.05 * (step - 61) + (4.0 if step > 73 else 0)
        arrivals.add(step, [[t, t + 0.01], [t, t + 0.0105]])
    assert arrivals.epoch_figures()[1] == "; pause: worker 1 did not answer for 3.1 s at step 73"
    heard.append([("worker 1", 50.0, 52.0, "evaluating epoch 1")])  # Before the epoch's steps.
    arrivals.add(121, [[110.0, 110.01], [110.0, 110.0105]])
    arrivals.add(122, [[110.05, 110.06], [110.05, 110.0605]])
    assert arrivals.epoch_figures()[1] == ("; pause: worker 1 did not answer for 2.0 s while "
                                           "evaluating epoch 1")


def test_the_stall_probe_keeps_only_the_silences_of_watched_calls(monkeypatch):
    from tfdp.cluster import stall as stall_module

    monkeypatch.setattr(stall_module, "PROBE_EVERY", 0.01)
    stall = stall_module.Stall(60, [("worker 0", "h:1"), ("worker 1", "h:2")])
    quiet = threading.Event()

    def ask(p):
        if p == 1 and quiet.is_set():
            quiet.clear()
            time.sleep(0.5)

    stall.probe(ask, longer_than=0.3)
    quiet.set()
    time.sleep(0.2)  # Nothing watched: nobody asked.
    assert quiet.is_set() and stall.silences() == []
    with stall.watching("training step 7"):
        time.sleep(0.8)
    heard, deadline = [], time.time() + 30  # The answer, however late a loaded machine is.
    while not heard and time.time() < deadline:
        heard = stall.silences()
        time.sleep(0.05)
    (silence,) = heard
    assert silence[0] == "worker 1" and silence[3] == "training step 7"
    assert 0.5 <= silence[2] - silence[1] < 30 and stall.silences() == []


def test_folded_times_unfold_near_the_hosts_clock():
    from tfdp.trace.arrivals import PERIOD, unfold

    now = 1795620000.25
    times = [now - 2.0, now - 0.5, now + 0.1]  # Read seconds later; a clock slightly ahead.
    folded = [t % PERIOD for t in times]
    assert unfold(folded, now) == pytest.approx(times, abs=1e-6)
