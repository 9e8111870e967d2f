"""SIGTERM is a preemption: stop at a step boundary, save, exit non-zero, resume later.

``Watch`` turns SIGTERM into a flag that the training loop reads between steps (a step is never
cut in half, and the state saved is a step's). Outside the training loop (loading data,
evaluating the last epoch, exporting) there is nothing new to save, and SIGTERM raises
``Preempted`` at once, so an export is abandoned (its temporary folder removed) and never
published.

Under MultiWorkerMirroredStrategy every worker must stop after the same step: the workers
exchange their flags with one small all-reduce every ``check_every`` steps (``agree`` in
``tfdp.keras_path.guard``), so a SIGTERM to any one worker stops all of them at the same step.
TensorFlow's ``PreemptionCheckpointHandler`` was not used: it probes the GCP metadata server
over the network when it is created, and on GCP CPU machines it does nothing at all
(``failure_handling.py``, ``detect_platform``/``save_checkpoint_if_preempted``).

Creating a MultiWorkerMirroredStrategy installs TensorFlow's C++ SIGTERM handler (its
preemption notifier), which ignores the signal unless that handler is used; ``Watch`` replaces
it, so SIGTERM always means something.
"""

import contextlib
import signal
import threading

from tfdp.errors import Preempted


class Watch:
    """While entered, SIGTERM sets ``requested`` during training (``with watch.training(step)``)
    and raises ``Preempted`` elsewhere. The loop says which step it has reached
    (``reached``), so a SIGTERM outside training names it."""

    def __init__(self):
        self.requested = False
        self.step = 0  # The last step reached, for the message when SIGTERM comes outside.
        self._training = False
        self._previous = None

    def __enter__(self):
        self.install()
        return self

    def install(self) -> None:
        """Take SIGTERM (again: creating a MultiWorkerMirroredStrategy installs TensorFlow's
        own C++ handler over Python's)."""
        if threading.current_thread() is threading.main_thread():  # Only it may set handlers.
            previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            if self._previous is None:
                self._previous = previous

    def __exit__(self, *exc):
        if self._previous is not None:
            # Python's idea of the previous handler: SIG_DFL where TF's C++ one was installed,
            # so after a run SIGTERM terminates the process again.
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        return False

    @contextlib.contextmanager
    def training(self, first_step: int):
        """Training from ``first_step``: a SIGTERM now waits for the end of a step."""
        self.step, self._training = first_step, True
        try:
            yield self
        finally:
            self._training = False

    def reached(self, step: int) -> None:
        self.step = step

    def _on_sigterm(self, signum, frame):
        self.requested = True
        if not self._training:
            raise Preempted(self.step)


def stop(step: int, backups, weights):
    """Raise ``Preempted`` after saving ``step`` (``weights()``: the weights in Keras order;
    nothing is saved without ``backups``)."""
    raise Preempted(step, backups.save(step, weights()) if backups else None)
