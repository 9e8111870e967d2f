"""The launcher's output: its own lines, and every process's lines copied with a prefix
(``[0]``, ``[chief]``), whole lines at a time, so two processes' lines never mix."""

import codecs
import os
import sys
import threading

_OUTPUT = threading.Lock()


def say(line: str) -> None:
    """One line of the launcher's own on stderr, in a single write (``print`` makes two, and a
    worker's output could land between them)."""
    with _OUTPUT:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def pump(stream, prefix, out):
    """Copy a worker's output as it comes, with ``prefix`` at the start of every line and after
    every carriage return (a progress bar redraws without a newline). Only whole lines (or
    redraws) go out, each under the output lock, so the lines of two workers never mix."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in iter(lambda: os.read(stream.fileno(), 4096), b""):
        pending += decoder.decode(chunk)
        cut = max(pending.rfind("\n"), pending.rfind("\r")) + 1
        if cut:
            emit(pending[:cut], prefix, out)
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
