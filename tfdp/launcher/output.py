"""The launcher's output: its own lines (what it starts: ``roles_of``, ``summary``), and every
process's lines copied with a prefix (``[0]``, ``[chief]``), whole lines at a time, so two
processes' lines never mix.

A worker that dies leaves its peers' TensorFlow runtimes logging the same four-line gRPC error
each time they try to reach it (dozens of times while the launcher restarts it), which buries
tfdp's own lines. ``Repeats`` lets the first such block through and drops the ones after it;
nothing else is filtered, tracebacks never.
"""

import codecs
import json
import os
import re
import sys
import threading

_OUTPUT = threading.Lock()
_LINE_OPEN = [False]  # Whether the last output left a line open (a progress bar's redraw).

# TensorFlow 2.21's C++ runtime, when a remote worker cannot be reached: a head line, then
# gRPC's detail on lines of their own.
_REPEATED_HEAD = re.compile(r"[EW]\d{4} [\d:.]+ +\d+ context\.cc:\d+\] Failed to (register|remove) "
                            r"function remotely due to ")
_CONTINUATION = re.compile(r"Additional GRPC error information from remote target |:UNKNOWN:"
                           r"Error received from peer |This could happen if the remote target "
                           r"has been disconnected from the client\.")


class Repeats:
    """Drops every block of ``_REPEATED_HEAD`` (with its continuation lines) after the first."""

    def __init__(self):
        self.seen, self.dropping = False, False

    def keep(self, line: str) -> bool:
        if _REPEATED_HEAD.match(line):
            self.dropping, self.seen = self.seen, True
            return not self.dropping
        if self.dropping and _CONTINUATION.match(line):
            return False
        self.dropping = False
        return True


def say(line: str) -> None:
    """One line of the launcher's own on stderr, in a single write (``print`` makes two, and a
    worker's output could land between them)."""
    with _OUTPUT:
        # On a line of its own, not at the end of a worker's progress bar.
        sys.stderr.write(("\n" if _LINE_OPEN[0] else "") + line + "\n")
        sys.stderr.flush()
        _LINE_OPEN[0] = False


def pump(stream, prefix, out):
    """Copy a worker's output as it comes, with ``prefix`` at the start of every line and after
    every carriage return (a progress bar redraws without a newline). Only whole lines (or
    redraws) go out, each under the output lock, so the lines of two workers never mix."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending, repeats = "", Repeats()
    for chunk in iter(lambda: os.read(stream.fileno(), 4096), b""):
        pending += decoder.decode(chunk)
        cut = max(pending.rfind("\n"), pending.rfind("\r")) + 1
        if cut:
            kept = "".join(line for line in pending[:cut].splitlines(True) if repeats.keep(line))
            if kept:
                emit(kept, prefix, out)
            pending = pending[cut:]
    pending += decoder.decode(b"", final=True)
    if pending:  # A last line without a newline.
        emit(pending, prefix, out)


def emit(text, prefix, out):
    pieces, at_line_start = [], True
    for char in text:
        if at_line_start and char not in "\r\n":
            pieces.append(prefix)
            at_line_start = False
        pieces.append(char)
        if char in "\r\n":
            at_line_start = True
    with _OUTPUT:
        out.write("".join(pieces))
        out.flush()
        _LINE_OPEN[0] = not text.endswith("\n")


def roles_of(specs: list) -> list:
    """What each process is, naming its program where the cluster runs more than one."""
    if len({spec.argv[2] for spec in specs}) == 1:
        return [spec.role for spec in specs]
    return [f"{spec.role} ({spec.argv[2]})" for spec in specs]


def summary(specs: list) -> str:
    """Who runs where: ``2 workers at a, b, cores [[0], [1]]`` (and the client paths' chief,
    and parameter servers)."""
    workers = [s for s in specs if s.role.startswith("worker")]
    chief = [s for s in specs if s.role == "chief"]
    ps = [s for s in specs if s.role.startswith("ps")]
    line = (f"{len(workers)} {'tfdp.server ' if chief else ''}"
            f"worker{'s' if len(workers) != 1 else ''} at "
            f"{', '.join(address_of(s) for s in workers)}")
    if ps:
        line += f", {len(ps)} parameter server(s) at {', '.join(address_of(s) for s in ps)}"
    if chief:
        line += f" and their chief (tfdp.train) at {address_of(chief[0])}"
    return line + f", cores {[s.cores for s in workers]}"


def address_of(spec) -> str:
    config = json.loads(spec.env["TF_CONFIG"])
    return config["cluster"][config["task"]["type"]][config["task"]["index"]]
