"""Reading a merged ``--trace_steps`` timeline."""


def lanes_by_step(trace: dict) -> dict:
    """{(worker, lane, step): {classes}} of a merged trace."""
    workers = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
               if e["name"] == "process_name"}
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    found = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["cat"] != "step":
            key = (workers[e["pid"]], lanes[(e["pid"], e["tid"])], e["args"]["step"])
            found.setdefault(key, set()).add(e["cat"])
    return found
