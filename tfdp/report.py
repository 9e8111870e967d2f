"""What a run shows and writes: a progress bar, one line per epoch, the final textbook line,
and in ``--workdir`` the metrics JSON, the accuracy plot and TensorBoard scalars.

Only the chief reports (under multi_worker every worker runs the same code; the others are
silent), so each figure appears once.
"""

import json
import os
import statistics
import sys

import tensorflow as tf

METRICS_FILE = "metrics.json"
PLOT_FILE = "accuracy.png"
TENSORBOARD_DIR = "tensorboard"


class Reporter:
    """Collects one record per epoch and writes everything after each epoch.

    ``history`` holds the records of epochs finished before a resume, so the JSON and the plot
    of a resumed run cover the whole run.
    """

    def __init__(self, workdir: str, config: dict, devices: list, is_chief: bool = True,
                 history: list = (), eval_examples: int = None, test_examples: int = None):
        self.workdir = workdir
        self.config = config
        self.devices = list(devices)
        self.is_chief = is_chief
        self.records = list(history)
        # Say so when the accuracy covers only part of the test set (--eval_steps).
        self.eval_note = ("" if eval_examples is None or eval_examples >= test_examples
                          else f" (first {eval_examples} of {test_examples} test examples)")
        self._writer = None
        if is_chief:
            os.makedirs(workdir, exist_ok=True)
            self._writer = tf.summary.create_file_writer(os.path.join(workdir, TENSORBOARD_DIR))

    def progress(self, epoch: int, steps: int):
        """A progress bar for one epoch (silent off the chief)."""
        import keras

        # Keras redraws the bar in place on any POSIX system; into a log or the launcher's
        # prefixed pipe that is noise, so only a terminal gets the live bar.
        live = self.is_chief and sys.stdout.isatty()
        if live:
            print(f"epoch {epoch + 1}/{self.config['epochs']}", flush=True)
        return keras.utils.Progbar(steps, verbose=1 if live else 0,
                                   stateful_metrics=["loss", "acc"])

    def epoch_end(self, epoch: int, loss: float, train_acc: float, test_acc: float,
                  seconds: float, examples: int) -> None:
        """Record an epoch (``seconds`` is training time only) and rewrite the outputs."""
        record = {"epoch": epoch + 1, "loss": float(loss), "train_acc": float(train_acc),
                  "test_acc": float(test_acc), "seconds": float(seconds),
                  "examples_per_sec": examples / seconds if seconds > 0 else 0.0}
        self.records = [r for r in self.records if r["epoch"] < record["epoch"]] + [record]
        if not self.is_chief:
            return
        print(f"epoch {record['epoch']}/{self.config['epochs']}: loss {loss:.4f}, "
              f"train acc {train_acc:.3f}, test acc{self.eval_note} {test_acc:.3f}, "
              f"{seconds:.1f} s, {record['examples_per_sec']:.0f} examples/s", flush=True)
        with self._writer.as_default(step=record["epoch"]):
            for key in ("loss", "train_acc", "test_acc", "seconds", "examples_per_sec"):
                tf.summary.scalar(key, record[key])
        self._writer.flush()
        self._write_json()
        self._plot()

    def sec_per_epoch(self) -> float:
        """Mean training seconds per epoch, as the textbook's timer.avg()."""
        return statistics.fmean(r["seconds"] for r in self.records)

    def final_line(self) -> str:
        """``test acc: 0.85, 16.5 sec/epoch on [...]``, printed by the chief."""
        line = (f"test acc{self.eval_note}: {self.records[-1]['test_acc']:.2f}, "
                f"{self.sec_per_epoch():.1f} sec/epoch on {self.devices}")
        if self.is_chief:
            print(line, flush=True)
        return line

    def _write_json(self):
        path = os.path.join(self.workdir, METRICS_FILE)
        payload = {"config": self.config, "devices": self.devices, "epochs": self.records}
        with open(path + ".tmp", "w") as f:
            json.dump(payload, f, indent=1)
        os.replace(path + ".tmp", path)

    def _plot(self):
        import matplotlib
        matplotlib.use("Agg")  # No display needed.
        import matplotlib.pyplot as plt

        epochs = [r["epoch"] for r in self.records]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for key, label in (("loss", "train loss"), ("train_acc", "train acc"),
                           ("test_acc", "test acc")):
            ax.plot(epochs, [r[key] for r in self.records], marker="o", label=label)
        ax.set_xlabel("epoch")
        ax.set_xlim(0.5, max(self.config["epochs"], epochs[-1]) + 0.5)
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_title(f"{self.config['model']}, {self.config['strategy']}, "
                     f"{len(self.devices)} device(s)")
        fig.tight_layout()
        fig.savefig(os.path.join(self.workdir, PLOT_FILE), dpi=100)
        plt.close(fig)


def load_history(workdir: str, finished: int) -> list:
    """Records of the first ``finished`` epochs of an earlier (interrupted) run in ``workdir``."""
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in json.load(f)["epochs"] if r["epoch"] <= finished]
