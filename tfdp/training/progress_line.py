"""The live line of an epoch's training (``Reporter.progress``'s)."""

import sys
import time


class Progress:
    """One line per epoch redrawn in place with a carriage return only (no backspaces or
    escape codes, which a notebook would print raw), at most ten times a second; the epoch line
    follows on a line of its own. ``regrouped`` ((Unix seconds, what): ``regrouping.after``)
    has the first update say how long after a loss or a join the group trains again."""

    def __init__(self, title: str, steps: int, live: bool, regrouped: tuple = None):
        self.title, self.steps, self.live = title, steps, live
        self.regrouped = regrouped
        self._start = time.perf_counter()
        self._shown = 0.0
        self._width = 0

    @property
    def wanted(self) -> bool:
        """Whether ``update`` shows anything (a path may skip reading a step's figures)."""
        return self.live or bool(self.regrouped)

    def update(self, step: int, values: list) -> None:
        if self.regrouped:
            since, what = self.regrouped
            self.regrouped = None
            print(f"{self.title}, step {step}/{self.steps}: training again "
                  f"{time.time() - since:.1f} s after {what}", flush=True)
        if not self.live:
            return
        now = time.perf_counter()
        if step < self.steps and now - self._shown < 0.1:
            return
        self._shown = now
        done = int(30 * step / self.steps)
        bar = "=" * done + (">" if done < 30 else "") + "." * (29 - done)
        text = (f"{self.title} {step}/{self.steps} [{bar}] "
                + " ".join(f"{name} {value:.4f}" for name, value in values)
                + f" {now - self._start:.0f} s")
        sys.stdout.write("\r" + text.ljust(self._width))
        sys.stdout.flush()
        self._width = len(text)

    def close(self) -> None:
        """Leave the finished line in place and start a new one (the epoch line's)."""
        if self.live and self._width:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self._width = 0
