"""The contract between the run skeleton and a training path (``--strategy``).

A path is a subclass of ``TrainingPath``, named by its description (``tfdp.paths``). It
supplies only what differs between paths: what it trains on, its training, and the model it
serves (the export itself is written once, here).
Everything else (the run folder, resuming, the plan, the report, backups, preemption, the
one-line error of a lost cluster) is the skeleton's (``tfdp.training.lifecycle``), once.

What is optional has its default here, once: a path on one machine, the chief, with no cluster
to watch, no servers to trace and no flight recorder.
"""

import abc
from typing import Callable, Optional, Sequence

from tfdp.cluster.stall import Stall, watching
from tfdp.trace.flight_recorder import FlightRecorder
from tfdp.training.state import TrainingState


class TrainingPath(abc.ABC):
    """Made with ``(resolved, backups)`` once the run folder is held (``resolved``: the run's
    ``tfdp.training.entry.ResolvedRun``, its config and its path's description). Its
    ``__init__`` sets up the devices or the strategy and sets ``devices`` (names for the
    report), ``replicas``, ``engine`` (what runs the replicas, for the plan line) and
    ``dataset``."""

    devices: list
    replicas: int
    engine: str
    is_chief: bool = True
    # The cluster whose loss ends the run in one line, [(name, "host:port")]; empty on one machine.
    peers: Sequence = ()
    # tfdp.cluster.stall's deadline on every call into a cluster, or None.
    stall: Optional[Stall] = None
    # The data it trains on (tfdp.data.sources.DatasetInfo: shape, classes, names), which its
    # __init__ prepares (tfdp.data.pipeline.dataset_of) or reads where a cluster's workers
    # prepared it: the model it builds needs it.
    dataset = None
    # (train, test) sizes when the data lives on a cluster's workers; None: the skeleton loads it.
    examples: Optional[tuple] = None
    # gather(steps) -> [steps of every worker]: the collective that agrees on a resume step.
    gather_steps: Optional[Callable] = None
    # The servers whose profiles the chief captures for --trace_steps, as peers.
    servers_traced: Sequence = ()
    # What a lost cluster's line points to (tfdp.trace.flight_recorder), or None.
    recorder: Optional[FlightRecorder] = None
    worker_index: int = 0
    num_workers: int = 1

    @abc.abstractmethod
    def __init__(self, resolved, backups):
        """``backups``: the run's ``tfdp.training.backups.Backups`` (their steps name what a
        lost cluster's line says is kept)."""

    def started(self) -> None:
        """Start-up is over: every worker has answered the resume step's gather (or this one
        gave up). A cluster's start-up watchdog stops here."""

    @abc.abstractmethod
    def train(self, run, state: Optional[TrainingState]) -> list:
        """Train by ``run`` (``tfdp.training.lifecycle.Run``) from ``state`` (a backup's, or the
        caller's weights; None for ``--init``); return the trained weights in Keras order."""

    @abc.abstractmethod
    def serving_model(self, precision: str):
        """The trained model as a Keras model computing in ``precision`` (the run's, or
        ``float32`` for the formats converted beside a bfloat16 or float64 SavedModel)."""

    def export(self, config) -> Optional[str]:
        """Write the trained model's next version under ``config.export_root`` with the serving
        contract and ``--export_formats`` (``tfdp.export.saved_model``); return its folder.
        A path whose workers all take part in saving says so by overriding this. Watched for a
        stall like every call into a cluster: saving waits for every executor of the eager
        context, a hung worker's too."""
        from tfdp.export import saved_model

        with watching(self.stall, "exporting the trained model"):
            return saved_model.export(self.serving_model(config.precision), config.export_root,
                                      config.export_formats,
                                      lambda: self.serving_model("float32"), config.eval_flip,
                                      self.dataset.class_names)
