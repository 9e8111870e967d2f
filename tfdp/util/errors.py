"""The exceptions a run ends with when it is not a bug.

Entry points catch them and print their message on one line with a non-zero exit and no
traceback; anything else that escapes is a bug and keeps its traceback.
"""

import contextlib

# ``python -m tfdp.train`` exits with this when it was preempted (SIGTERM) and saved its state:
# "temporary failure, run again" (sysexits.h EX_TEMPFAIL). The same command resumes.
PREEMPTED_EXIT_CODE = 75

SAME_COMMAND = "run the same command again"
# What the lines that say how to resume say to run: the innermost run's (``naming_the_run``).
_RERUN = [SAME_COMMAND]


def rerun() -> str:
    """How to run the run under way again so that it resumes, for the lines that say so."""
    return _RERUN[-1]


def rerun_in(run_dir: str = None) -> str:
    """How to resume a run whose folder a default chose, ``run_dir`` (None: ``--workdir`` gave
    it, and the same command finds it): the default is new for every run, so the same command
    alone would train again from the start."""
    return f"{SAME_COMMAND} with --workdir={run_dir}" if run_dir else SAME_COMMAND


@contextlib.contextmanager
def naming_the_run(run_dir: str = None):
    """While a run runs, ``rerun()`` says ``rerun_in(run_dir)``."""
    _RERUN.append(rerun_in(run_dir))
    try:
        yield
    finally:
        _RERUN.pop()


# The run lost its cluster, a peer gone or hung (sysexits.h EX_UNAVAILABLE): a launcher whose
# group goes on tells the survivors of a loss from the worker lost by it.
LOST_CONTACT_EXIT_CODE = 69


class UserError(ValueError):
    """A mistake the user can fix; the message names the flag or file and what to do.

    ``tfdp.run`` raises it as it is (a ``ValueError``); the command line prints its message."""

    exit_code = 1  # What the command line exits with.


class LostContact(UserError):
    """The run lost contact with its cluster (``tfdp.cluster.tf_config.lost_contact`` says
    who and what is kept)."""

    exit_code = LOST_CONTACT_EXIT_CODE


class Diverged(UserError):
    """The training loss became NaN or infinite, or exploded: nothing is exported."""

    def __init__(self, loss: float, epoch: int, step: int, steps: int, exact: bool = True,
                 why: str = ""):
        at = "at" if exact else "by"  # The Keras path looks every few steps.
        super().__init__(f"the training loss is {loss:.4g} {at} epoch {epoch + 1}, step "
                         f"{step}/{steps}{why}: training diverged, nothing was exported; try a "
                         "smaller --lr")
        self.epoch, self.step = epoch, step


class Finished(UserError):
    """The run folder holds a run that finished and exported: a rerun of the same command
    trains and exports nothing (``python -m tfdp.train`` says so and exits 0)."""

    def __init__(self, run_dir: str, export_path: str):
        super().__init__(f"the run in {run_dir} has finished (exported {export_path}): nothing "
                         "to train or export; give a new --workdir to train again")
        self.run_dir, self.export_path = run_dir, export_path


# A second Ctrl-C stopped the run at once: 128 + SIGINT, as a shell reports it.
INTERRUPTED_EXIT_CODE = 130


class Preempted(BaseException):
    """A SIGTERM (or a first Ctrl-C: ``by``) stopped the run; ``saved`` says where its state
    is (None: nothing to save).

    A ``BaseException``, as ``KeyboardInterrupt`` is: a signal's handler raises it wherever the
    program happens to be, and libraries catch ``Exception`` broadly there (TFDS' own
    ``__init__`` does, and was left half-imported by a Ctrl-C: an AttributeError followed).
    Catch it by name: ``except tfdp.Preempted``."""

    def __init__(self, step: int, saved: str = None, by: str = None, then: str = None):
        by = by or "SIGTERM"
        where = f"state of step {step} saved in {saved}" if saved else "nothing new to save"
        then = then or f"{rerun()} to resume"  # What comes next: a launcher may say its own.
        super().__init__(f"preempted ({by}) at step {step}: {where}; {then}")
        self.step, self.saved, self.by = step, saved, by


class Interrupted(KeyboardInterrupt):
    """A second Ctrl-C: stopped at once, without saving the steps since the newest backup."""

    def __init__(self):
        super().__init__("stopped at once (a second Ctrl-C): the steps since the newest backup "
                         f"are lost; {rerun()} to resume from it")
