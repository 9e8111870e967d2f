"""``timeline.png``: the traced steps of a merged timeline (``tfdp.trace.timeline``) drawn by
tfdp, every worker's lanes against time, coloured by class, with the step boundaries and each
step's communication share."""

from tfdp.trace.timeline import CLASSES, lane_order
from tfdp.util import charts

COLOURS = {"input": "#8c8c8c", "forward": "#4c72b0", "backward": "#dd8452",
           "communication": "#c44e52", "update": "#55a868", "host wait": "#e8d166",
           "other": "#d0d0d0"}


def communication_share(part: dict) -> dict:
    """Per step: the fraction of its wall time in which some lane was communicating."""
    shares = {}
    for s in part["steps"]:
        spans = sorted((e["start_ns"], e["end_ns"]) for e in part["events"]
                       if e["step"] == s["step"] and e["class"] == "communication")
        busy, reach = 0, s["start_ns"]
        for start, end in spans:
            start, end = max(start, reach), min(end, s["end_ns"])
            if end > start:
                busy += end - start
                reach = end
        shares[s["step"]] = busy / max(s["end_ns"] - s["start_ns"], 1)
    return shares


def draw(parts: list, path: str) -> None:
    """``timeline.png``: every worker's lanes against time, coloured by class."""
    from matplotlib.patches import Patch

    origin = min((e["start_ns"] for part in parts for e in part["events"]), default=0)
    rows = [(part["worker"], lane) for part in parts
            for lane in sorted({e["lane"] for e in part["events"]}, key=lane_order)]
    fig = charts.figure(12, 1.0 + 0.45 * len(rows))
    ax = fig.subplots()
    for y, (worker, lane) in enumerate(rows):
        part = next(p for p in parts if p["worker"] == worker)
        for kind in ("other", "host wait", *CLASSES[:-1]):  # Long, enclosing spans first.
            spans = [((e["start_ns"] - origin) / 1e6, max(e["end_ns"] - e["start_ns"], 1) / 1e6)
                     for e in part["events"] if e["lane"] == lane and e["class"] == kind]
            if spans:
                ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=COLOURS[kind])
    for part in parts:
        shares = communication_share(part)
        top = min(y for y, (worker, _) in enumerate(rows) if worker == part["worker"])
        for s in part["steps"]:
            start, end = ((s["start_ns"] - origin) / 1e6, (s["end_ns"] - origin) / 1e6)
            ax.axvline(start, color="black", linewidth=0.6)
            ax.axvline(end, color="black", linewidth=0.6, linestyle=":")
            ax.text(start, top - 0.42, f" step {s['step']}: communication "
                    f"{shares[s['step']]:.0%}", fontsize=7, va="bottom")
    ax.set_yticks(range(len(rows)), [f"{w}: {lane}" for w, lane in rows])
    ax.set_ylim(-0.9, len(rows) - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.legend(handles=[Patch(color=COLOURS[k], label=k) for k in (*CLASSES, "other")],
              loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=7, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
