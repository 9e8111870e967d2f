"""The flight recorder: when a run loses its cluster (a peer died, or one call outlasted
``--collective_timeout``), the last steps' times go to ``flight_recorder.json`` in the run
folder, and the one-line error names that file.

A path keeps the times in a ``FlightRecorder`` of its own (the synchronous paths' per-replica
arrivals, ``tfdp.trace.arrivals``; the parameter-server path's per-worker steps,
``tfdp.paths.parameter_server.pace``): ``describes`` says what they are, ``dump(why)`` writes them
with ``write`` and returns the file's path ('' when there is nothing to write), and
``recorded(why)`` ends the lost cluster's line with it.
"""

import json
import os

FILE = "flight_recorder.json"
KEPT = 32  # Steps a recorder keeps.


def write(run_dir: str, record: dict) -> str:
    """Write ``record`` to the run folder's flight recorder file; its path, or '' if it could
    not be written (the run is ending in an error already: that error matters more)."""
    if not run_dir:
        return ""
    path = os.path.join(run_dir, FILE)
    try:
        with open(path + ".partial", "w") as f:
            json.dump(record, f, indent=1)
        os.replace(path + ".partial", path)
    except OSError:
        return ""
    return path


class FlightRecorder:
    """What every path's recorder shares: the line's end. A recorder sets ``describes`` and
    implements ``dump``."""

    describes = "times"

    def dump(self, why: str = "") -> str:
        raise NotImplementedError

    def recorded(self, why: str) -> str:
        """The end of a lost cluster's line: this recorder's file, written now, if any."""
        path = self.dump(why)
        return f" (the last steps' {self.describes}: {path})" if path else ""
