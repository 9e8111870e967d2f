"""What a run shows and writes: a live progress line, one line per epoch, the final textbook line,
and in ``--workdir`` the metrics JSON, the accuracy and loss plot and TensorBoard scalars.

Only the chief reports (under multi_worker every worker runs the same code; the others are
silent), so each figure appears once.
"""

import io
import json
import os
import statistics
import sys
from typing import NamedTuple

import tensorflow as tf

from tfdp.config.settings import LIVE_PROGRESS_ENV
from tfdp.launcher import regrouping
from tfdp.training import history_chart
from tfdp.training.progress_line import Progress
from tfdp.util import files
from tfdp.util.logs import logger

METRICS_FILE = "metrics.json"
TENSORBOARD_DIR = "tensorboard"


class Trained(NamedTuple):
    """An epoch's training as its path measured it: the running ``loss`` and ``train_acc``,
    ``seconds`` of training only (evaluation comes after), over ``examples`` examples;
    ``resumed_at``: the step within the epoch a resumed run started from (the figures then cover
    the steps after it only)."""
    loss: float
    train_acc: float
    seconds: float
    examples: int
    resumed_at: int = 0


class Reporter:
    """Collects one record per epoch and writes everything after each epoch (the chart of
    accuracy and loss: ``history_chart.Chart``).

    ``facts`` is what the run actually used (configuration, global batch, per-replica shards,
    devices, init, precision), written into ``metrics.json`` with the epochs and, at the end,
    the export path. ``history`` holds the records of epochs finished before a resume, so the
    JSON and the plot of a resumed run cover the whole run. The same metric names appear in the
    progress bar, the epoch line, ``metrics.json``, TensorBoard and the plot: ``loss`` and
    ``train_acc`` while training, ``test_loss`` and ``test_acc`` after each epoch.
    """

    def __init__(self, workdir: str, facts: dict, devices: list, is_chief: bool = True,
                 history: list = (), eval_note: str = "", evaluated: str = "test"):
        self.workdir, self.facts, self.devices = workdir, dict(facts), list(devices)
        self.config = self.facts.get("config", self.facts)
        self.is_chief, self.records = is_chief, list(history)
        self.eval_note = eval_note  # Says so when evaluation covers part of its split.
        # What the lines call the split evaluated after each epoch, as Keras does: "val" for a
        # validation split (metrics.json's records keep test_loss and test_acc, and its
        # "evaluated" names the split).
        self.label = "val" if evaluated == "validation" else "test"
        self.test_note = ""
        self._progress = None
        # The chief of a group re-formed after a loss or a join says when it trains again.
        self._regrouped = regrouping.after() if is_chief else None
        self._writers = {}
        self._chart = None  # None off the chief, and with --plots=false.
        self.plots = self.config.get("plots") is not False
        if is_chief:
            os.makedirs(workdir, exist_ok=True)
            if self.plots:
                self._chart = history_chart.Chart(
                    workdir, self.config["epochs"], f"{self.config['model']}, "
                    f"{self.config['strategy']}, {len(self.devices)} device(s)")
            # Two TensorBoard runs with the same tags, so TensorBoard overlays train and test.
            self._writers = {part: tf.summary.create_file_writer(
                os.path.join(workdir, TENSORBOARD_DIR, part)) for part in ("train", "test")}

    def progress(self, epoch: int, steps: int) -> Progress:
        """The live line of one epoch: shown by the chief in a terminal, in a notebook, or when
        the launcher asks for its chief's (``TFDP_LIVE_PROGRESS``); into a log or a pipe a
        line redrawn in place is noise, so elsewhere it is silent."""
        live = self.is_chief and (sys.stdout.isatty() or "ipykernel" in sys.modules
                                  or os.environ.get(LIVE_PROGRESS_ENV) == "1")
        self._progress = Progress(f"epoch {epoch + 1}/{self.config['epochs']}", steps, live,
                                  self._regrouped)
        self._regrouped = None
        return self._progress

    def close_progress(self) -> None:
        """End the epoch's live line, if one is open."""
        if self._progress:
            self._progress.close()

    def epoch_end(self, epoch: int, trained: "Trained", test_loss: float, test_acc: float,
                  extra: dict = None, note: str = "") -> None:
        """Record an epoch (``trained``: its training, as the path measured it) and rewrite the
        outputs. ``extra``: a path's own figures for the record (the parameter servers'
        staleness), ``note`` their words on the line."""
        loss, train_acc, seconds, examples, resumed_at = trained
        record = {"epoch": epoch + 1, "loss": float(loss), "train_acc": float(train_acc),
                  "test_loss": float(test_loss), "test_acc": float(test_acc),
                  "seconds": float(seconds), "examples": int(examples),
                  "examples_per_sec": examples / seconds if seconds > 0 else 0.0}
        if resumed_at:
            record["resumed_at_step"] = resumed_at
        record.update(extra or {})
        self.records = [r for r in self.records if r["epoch"] < record["epoch"]] + [record]
        if not self.is_chief:
            return
        if self._progress:
            self._progress.close()
        print(f"epoch {record['epoch']}/{self.config['epochs']}: loss {loss:.4f}, "
              f"train_acc {train_acc:.3f}, {self.label}_loss {test_loss:.4f}, "
              f"{self.label}_acc {test_acc:.3f}{self.eval_note}, {seconds:.1f} s, "
              f"{record['examples_per_sec']:.0f} examples/s{note}"
              + (f" (resumed: steps after {resumed_at} only)" if resumed_at else ""), flush=True)
        scalars = {"train": {"loss": loss, "acc": train_acc, "seconds": seconds,
                             "examples_per_sec": record["examples_per_sec"]},
                   "test": {"loss": test_loss, "acc": test_acc}}
        for part, values in scalars.items():
            with self._writers[part].as_default(step=record["epoch"]):  # step = epoch
                for key, value in values.items():
                    tf.summary.scalar(key, value, description=f"{part} {key} per epoch")
            self._writers[part].flush()
        self._write_json()
        if self._chart:
            self._chart.epoch_end(self.records)

    def add_facts(self, **facts) -> None:
        """Add a path's own facts to ``metrics.json`` (the parameter servers' holdings)."""
        self.facts.update(facts)

    def record_export(self, path: str) -> None:
        """Add the export path to ``metrics.json``."""
        self.facts["export_path"] = path
        if self.is_chief and self.records:
            self._write_json()

    def sec_per_epoch(self) -> float:
        """Mean training seconds per epoch, as the textbook's timer.avg() (over whole epochs,
        when a resumed run has part of one)."""
        whole = [r for r in self.records if "resumed_at_step" not in r] or self.records
        return statistics.fmean(r["seconds"] for r in whole)

    def resumed_trained(self, final: dict, test_note: str) -> None:
        """A run resumed after its last step: its final evaluation's facts (``load_final``),
        recorded before the interruption, are this run's."""
        self.facts.update(final)
        self.test_note = test_note

    def tested(self, loss: float, accuracy: float, note: str = "") -> None:
        """The test set's figures, evaluated once after training where a validation split was
        evaluated after every epoch: a line, and ``metrics.json``'s ``test``."""
        self.facts["test"] = {"loss": float(loss), "acc": float(accuracy)}
        self.test_note = note
        if self.is_chief:
            print(f"test set, evaluated once after training{note}: loss {loss:.4f}, "
                  f"acc {accuracy:.4f}", flush=True)
            self._write_json()

    def confusion(self, counts, split: str) -> None:
        """The final evaluation's confusion matrix (``tfdp.training.confusion``): in
        ``metrics.json``, as ``confusion.png`` and in TensorBoard."""
        from tfdp.training import confusion

        names = self.facts.get("class_names") or [str(k) for k in range(len(counts))]
        self._recorded("confusion", confusion.record(counts, names, split), lambda: (
            confusion.figure(counts, names, f"{split} set, epoch {self.records[-1]['epoch']}"),
            confusion.FILE, f"the confusion matrix of the {split} set"))

    def mistakes(self, found: list, images, split: str) -> None:
        """The final evaluation's most confident mistakes (``tfdp.training.mistakes``: found
        by the export): in ``metrics.json``, as ``mistakes.png`` and in TensorBoard."""
        from tfdp.training import mistakes

        self._recorded("mistakes", {"split": split, "shown": found}, lambda: (
            mistakes.figure(images, found,
                            f"the {split} set's most confident mistakes (index, true, predicted)"),
            mistakes.FILE, f"the {split} set's images the export gets wrong most confidently"))

    def _recorded(self, key: str, value, drawing) -> None:
        """``value`` kept as ``key`` in ``metrics.json``, written by the chief, which also
        draws it where the run draws (``--plots``): ``drawing()`` gives the figure, its file
        and its TensorBoard description (the image's tag is ``key``)."""
        self.facts[key] = value
        if not self.is_chief:
            return
        self._write_json()
        if self.plots:
            fig, name, description = drawing()
            self._drawn(fig, name, key, description)

    def _drawn(self, fig, name: str, tag: str, description: str) -> None:
        """``fig`` drawn once to PNG, written as ``name`` in the run folder and given to
        TensorBoard as the image ``tag`` at the last epoch."""
        drawn = io.BytesIO()
        fig.savefig(drawn, format="png", dpi=100)
        png = drawn.getvalue()
        files.write_atomic(os.path.join(self.workdir, name), lambda f: f.write(png), mode="wb")
        image = tf.image.decode_png(png, channels=3)[tf.newaxis]
        with self._writers["test"].as_default(step=self.records[-1]["epoch"]):
            tf.summary.image(tag, image, description=description)
        self._writers["test"].flush()

    def final_line(self) -> str:
        """``test acc: 0.85, 16.5 sec/epoch on [...]``, printed by the chief: the test set's
        accuracy (once at the end, where a validation split was evaluated after each epoch),
        else the last validation's. '' with no records: a worker other than the chief that
        resumed after the last step (the records are in the chief's ``metrics.json``)."""
        if not self.records:
            return ""
        tested = self.facts.get("test")
        label, accuracy, note = (("test", tested["acc"], self.test_note) if tested
                                 else (self.label, self.records[-1]["test_acc"], self.eval_note))
        line = (f"{label} acc{note}: {accuracy:.2f}, "
                f"{self.sec_per_epoch():.1f} sec/epoch on {self.devices}")
        if self.is_chief:
            print(line, flush=True)
        return line

    def draw_chart(self) -> None:
        """``accuracy.png`` with every epoch, now (the run has trained), by the chief."""
        if self._chart:
            self._chart.draw(self.records)

    def _write_json(self):
        payload = dict(self.facts, devices=self.devices, epochs=self.records)
        files.write_atomic(os.path.join(self.workdir, METRICS_FILE),
                             lambda f: json.dump(payload, f, indent=1))


def exported(workdir: str):
    """The export a finished run in ``workdir`` recorded in ``metrics.json``, or None (no run,
    or one that has not exported yet)."""
    try:
        with open(os.path.join(workdir, METRICS_FILE)) as f:
            return json.load(f).get("export_path")
    except (OSError, ValueError, AttributeError):
        return None


# What a run's final evaluation adds to metrics.json: a run resumed after its last step (to
# export) keeps them.
FINAL_FACTS = ("test", "confusion")


def load_final(workdir: str) -> dict:
    """The ``FINAL_FACTS`` an earlier run in ``workdir`` recorded in ``metrics.json``."""
    try:
        with open(os.path.join(workdir, METRICS_FILE)) as f:
            recorded = json.load(f)
        return {name: recorded[name] for name in FINAL_FACTS if name in recorded}
    except (OSError, ValueError, TypeError):
        return {}


def load_history(workdir: str, finished: int) -> list:
    """Records of the first ``finished`` epochs of an earlier (interrupted) run in ``workdir``."""
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            return [r for r in json.load(f)["epochs"] if r["epoch"] <= finished]
    except (OSError, ValueError, KeyError, TypeError) as e:  # Its history only: train on.
        logger.warning("cannot read the earlier epochs from %s (%s): metrics.json and the plot "
                       "will start at the resumed epoch", path, e)
        return []
