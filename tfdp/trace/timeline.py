"""A timeline of chosen steps (``--trace_steps=A:B``, section 12.3): TensorFlow's profiler records
them, and tfdp turns what it recorded into one picture of the step across replicas and workers.

Written into the run folder:

* ``tensorboard/plugins/profile/<time>/<host>.xplane.pb`` (``tensorboard/worker-<i>/...``
  with several workers): the profiler's own data, which TensorBoard's profile tab (the
  ``xprof`` package) opens: ``tensorboard --logdir runs``.
* ``trace/<process>.json`` (``chief``, ``worker-<i>``, ``ps-<i>``): each process's events, and
  ``timeline.json``, every process's merged on one clock in the Chrome trace-event format (the
  chief merges what the others wrote, and what it captured of the servers it drives): it
  opens in Perfetto's UI (ui.perfetto.dev) and ``chrome://tracing``. A process per worker, a
  lane per replica (device), one for the waits for other devices' tensors (``receives``) and
  one for the host; every event classed (its ``cat``) as input, forward, backward,
  communication, update or host wait, with the parameter it concerns in its ``args`` where
  there is one.
* ``timeline.png``: the traced steps drawn by tfdp (``tfdp.trace.timeline_png``), lanes
  against time, coloured by class, with the step boundaries and each step's communication
  share.

Lanes and classes come from the names of TensorFlow's ops, not from threads: logical devices on
one CPU share one thread pool, so a thread says nothing about a replica. The from-scratch step
names its ops ``replica_<d>/{forward,backward,update}`` and ``allreduce/replica_<d>``
(``tfdp.paths.manual.allreduce.on_replica``); Keras' ops under ``MirroredStrategy`` carry
``replica_<d>/`` for every replica but the first, and ``gradient_tape/`` when they belong to the
backward pass.

The clock: each worker's profile is normalised to its own start, which the profile records in
Unix nanoseconds (``profile_start_time``); events are placed at that start plus their offset.
Workers on one machine (``tfdp.launch``, emulated hosts) therefore share one clock exactly;
across real machines the merge is as good as their clocks' agreement (NTP: typically within a
millisecond on a LAN, which is the size of a LeNet step's communication: read cross-machine
gaps of less than that as unknown).
"""

import bisect
import glob
import json
import os
import re

CLASSES = ("input", "forward", "backward", "communication", "update", "host wait")
HOST = "host"
RECEIVES = "receives"
_COMPUTE = ("forward", "backward", "update")
_ASYNC = "ExecutorState::ProcessAsync::"
_CONTROL = re.compile(r"loop_body_control|LoopCond")
_REPLICA = re.compile(r"(?:^|/)replica_(\d+)(?:_\d+)?(?:/|$)")
_COMMUNICATION_OPS = ("_Send", "_Recv", "_HostSend", "_HostRecv", "NcclAllReduce")
# What the host's thread does while it waits for TensorFlow: runs a compiled call (the CPU's
# eager calls return when the call is done) or reads a result.
_HOST_WAITS = ("TFE_Py_ExecuteCancelable", "TFE_Py_Execute", "TFE_Py_TensorShapeSlice",
               "TFE_TensorHandleResolve")
_PARAMETER = re.compile(r"(?:^|/)update(?:_\d+)?/(\w+?)(?:_\d+)?(?:/|$)")
# step_marks: the from-scratch replicas' marks of the step their update began and finished.
_UPDATE = re.compile(r"(?:^|/)(?:update|step_marks|sgd|SGD)(?:_\d+)?(?:/|$)")
_MODEL = re.compile(r"(?:^|/)(?:lenet|resnet)")  # Keras' layers, inside the model's scope
_INPUT = re.compile(r"(?:^|/)input(?:_\d+)?/")
_FORWARD = re.compile(r"(?:^|/)forward(?:_\d+)?(?:/|$)")
_BACKWARD = re.compile(r"(?:^|/)backward(?:_\d+)?/")


def classify(node: str, op_type: str) -> tuple:
    """(class, replica or None, parameter or None) of an op named ``node`` of type
    ``op_type``."""
    found = _REPLICA.search(node)
    replica = int(found.group(1)) if found else None
    parameter = _PARAMETER.search(node)
    if _INPUT.search(node) or node.startswith(("Iterator::", "IteratorGetNext")) or op_type in (
            "IteratorGetNext", "IteratorGetNextSync"):
        kind = "input"  # Before communication: sending a replica its shard is input.
    elif (op_type in _COMMUNICATION_OPS or op_type.startswith("Collective")
            or "allreduce" in node or "CrossDeviceOps" in node):
        kind = "communication"
    elif "gradient_tape" in node or _BACKWARD.search(node):
        kind = "backward"
    elif _UPDATE.search(node) or op_type.startswith(("AssignSub", "ResourceApply")):
        kind = "update"
    elif _FORWARD.search(node) or replica is not None or _MODEL.search(node):
        kind = "forward"
    else:
        kind = "other"
    return kind, replica, parameter.group(1) if parameter else None


def events_of(xplane_path: str, steps: list = None) -> list:
    """The op and host events of one profile, each ``{"name", "class", "lane", "start_ns",
    "end_ns", "node", "parameter"}``, and the steps ``{"step", "start_ns", "end_ns"}`` its
    ``train`` markers delimit: ``(events, steps)``, on the Unix clock. A server's profile has
    no markers: ``steps``, the chief's, cut it."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as f:
        space.ParseFromString(f.read())
    origin = 0
    for plane in space.planes:
        if plane.name == "Task Environment":
            for stat in plane.stats:
                if plane.stat_metadata[stat.metadata_id].name == "profile_start_time":
                    origin = stat.uint64_value or stat.int64_value
    events, marked = [], []
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        names, stat_names = plane.event_metadata, plane.stat_metadata
        receives = _Receives()
        for line in plane.lines:
            for event in line.events:
                name = names[event.metadata_id].name
                start = origin + line.timestamp_ns + event.offset_ps // 1000
                end = start + event.duration_ps // 1000
                if name == "train":
                    stats = {stat_names[s.metadata_id].name: s.int64_value or s.uint64_value
                             for s in event.stats}
                    marked.append({"step": int(stats.get("step_num", 0)), "start_ns": start,
                                   "end_ns": end})
                elif name.startswith("Iterator::"):  # tf.data, on the host's threads
                    events.append({"name": name.rstrip(":").rsplit("::", 1)[-1],
                                   "class": "input", "lane": HOST, "start_ns": start,
                                   "end_ns": end, "node": name, "parameter": None})
                elif ":" in name and not name.endswith(":") and "::" not in name:
                    node, op_type = name.rsplit(":", 1)
                    kind, replica, parameter = classify(node, op_type)
                    if replica is None and (kind in ("forward", "backward", "update")
                                            or op_type.startswith(("Collective", "Nccl"))):
                        replica = 0  # Keras names every replica's ops but the first's.
                    # Other ops of no replica (the window's loop, the step's bookkeeping) run
                    # for the host's program: its lane.
                    events.append({"name": parameter or op_type, "class": kind,
                                   "lane": HOST if replica is None else f"replica {replica}",
                                   "start_ns": start, "end_ns": end, "node": node,
                                   "parameter": parameter})
                elif name in _HOST_WAITS:
                    events.append({"name": name, "class": "host wait", "lane": HOST,
                                   "start_ns": start, "end_ns": end, "node": "",
                                   "parameter": None})
                elif name.startswith(_ASYNC):
                    receives.see(name, {stat_names[s.metadata_id].name: s for s in event.stats},
                                 stat_names, start, end)
        events += receives.events(sorted(e["end_ns"] for e in events if e["class"] in _COMPUTE))
    steps = sorted(marked if steps is None else steps, key=lambda s: s["start_ns"])
    return _within_steps(events, steps), steps


class _Receives:
    """What a process waits for from others once its own work is done: the exposed part of
    receiving. A ``_Recv`` kernel's own event lasts only while it is issued, and TensorFlow
    issues receives when the step starts; the executor marks that start
    (``ExecutorState::ProcessAsync::Start``) and when the tensor has arrived (``...::Done``),
    linked by one id. A receive's span on the ``receives`` lane runs from the later of its
    start and the end of the process's last computation before the tensor arrived, to its
    arrival: the transfer and the sender's lateness that nothing of its own hides. A process
    that computes nothing (the client, the coordinator) waits on its host lane instead; the
    window loop's control messages are not data: both are left out."""

    def __init__(self):
        self.started, self.spans = {}, []

    def see(self, name: str, stats: dict, stat_names, start: int, end: int) -> None:
        if name.endswith("Start") and "_p" in stats and "name" in stats:
            kernel = stats.get("kernel_type")
            self.started[stats["_p"].uint64_value or stats["_p"].int64_value] = (
                start, stat_names[stats["name"].ref_value].name,
                stat_names[kernel.ref_value].name if kernel else "")
        elif name.endswith("Done") and "_c" in stats:
            self.spans.append((stats["_c"].uint64_value or stats["_c"].int64_value, end))

    def events(self, compute_ends: list) -> list:
        found = []
        for key, end in self.spans:
            start, node, op_type = self.started.get(key, (None, "", ""))
            if start is None or op_type not in ("_Recv", "_HostRecv") or _CONTROL.search(node):
                continue
            done_before = bisect.bisect_right(compute_ends, end)
            if not done_before:
                continue
            start = max(start, compute_ends[done_before - 1])
            kind = "input" if _INPUT.search(node) else "communication"
            found.append({"name": "receive", "class": kind, "lane": RECEIVES, "start_ns": start,
                          "end_ns": max(end, start), "node": node, "parameter": None})
        return found


def _within_steps(events: list, steps: list) -> list:
    """The events that start inside a traced step, each with its step number."""
    kept = []
    for event in events:
        for step in steps:
            if step["start_ns"] <= event["start_ns"] <= step["end_ns"]:
                kept.append(dict(event, step=step["step"]))
                break
    return kept


def newest_profile(capture_dir: str) -> str:
    """The newest ``.xplane.pb`` the profiler wrote under ``capture_dir``."""
    found = glob.glob(os.path.join(capture_dir, "plugins", "profile", "*", "*.xplane.pb"))
    if not found:
        raise FileNotFoundError(f"the profiler wrote no .xplane.pb under {capture_dir}")
    return max(found, key=os.path.getmtime)


def write_part(path: str, worker: str, events: list, steps: list) -> None:
    """One worker's events (``events_of``) as a JSON part, for ``merge``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.partial-{os.getpid()}"
    with open(temporary, "w") as f:
        json.dump({"worker": worker, "events": events, "steps": steps}, f)
    os.replace(temporary, path)


def merge(parts: list) -> dict:
    """Chrome trace-event JSON of every part: a process per worker, a thread per lane, time in
    microseconds from the earliest event of all (``otherData`` keeps that origin in Unix
    nanoseconds)."""
    origin = min((e["start_ns"] for part in parts for e in part["events"]), default=0)
    trace, processes = [], {}
    for pid, part in enumerate(parts, start=1):
        processes[part["worker"]] = pid
        trace.append({"ph": "M", "name": "process_name", "pid": pid,
                      "args": {"name": part["worker"]}})
        lanes = sorted({e["lane"] for e in part["events"]} | {HOST}, key=lane_order)
        for tid, lane in enumerate(lanes, start=1):
            trace.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                          "args": {"name": lane}})
            trace.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                          "args": {"sort_index": tid}})
        tids = {lane: tid for tid, lane in enumerate(lanes, start=1)}
        for e in part["events"]:
            args = {"node": e["node"], "step": e["step"]}
            if e["parameter"]:
                args["parameter"] = e["parameter"]
            trace.append({"ph": "X", "name": e["name"], "cat": e["class"], "pid": pid,
                          "tid": tids[e["lane"]], "ts": (e["start_ns"] - origin) / 1e3,
                          "dur": max(e["end_ns"] - e["start_ns"], 1) / 1e3, "args": args})
        for s in part["steps"]:
            trace.append({"ph": "X", "name": f"step {s['step']}", "cat": "step", "pid": pid,
                          "tid": tids[HOST], "ts": (s["start_ns"] - origin) / 1e3,
                          "dur": (s["end_ns"] - s["start_ns"]) / 1e3, "args": {}})
    return {"traceEvents": trace, "displayTimeUnit": "ms",
            "otherData": {"clock_origin_unix_ns": origin, "classes": list(CLASSES),
                          "workers": list(processes)}}


def lane_order(lane: str):
    """Replicas by number, then the receives lane, then the host's."""
    return (lane in (HOST, RECEIVES), lane == HOST,
            int(lane.split()[-1]) if lane.startswith("replica") else 0, lane)
