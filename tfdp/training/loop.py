"""The epoch loop of every from-scratch-style path: the from-scratch path (local and across
machines) and the parameter-server path. Written once, it owns what every step and epoch
share: resuming within an epoch, the learning rate of each step, the progress line, the running
loss and accuracy, divergence and preemption; each epoch ends in the run's one ``EpochEnd``
(evaluation, the epoch's record, backups).

A path supplies its ``Steps``: how a call of ``count`` steps is issued (``issue``) and how its
results are collected (``collect``, which waits for them), how many steps one call may run
(``sync_every``: section 12.2's cadence of synchronisation; the host reads losses, accuracy and
finiteness once per call), how many calls may be in flight (``window``: 1 reads each call's
results before issuing the next; the parameter-server path keeps several workers busy), where
the batches come from, how evaluation runs, and its training state (what a backup holds).

Preemption is honoured between calls, so the step saved is one every replica finished; a
divergence is found when its call's losses are read, and named by its own step.
"""

import collections
import time

import numpy as np

from tfdp.cluster.stall import watching
from tfdp.training import divergence
from tfdp.training.epoch_end import EpochEnd
from tfdp.training.report import Trained


class Steps:
    """What a path gives the loop. ``batches(first_epoch, offset)`` returns an iterator over
    tuples of tensors whose last one has an entry per example (labels, or example indices);
    ``issue(batches, first_step, count)`` starts global steps ``first_step`` (counted from 0)
    to ``first_step + count - 1`` on the next ``count`` batches, each at the plan's learning
    rate of its step, and returns something ``collect`` turns into one ``(loss, correct,
    examples)`` per step, waiting for them; ``evaluate()`` returns (loss, accuracy) on the split
    evaluated after every epoch, ``evaluate(final=True)`` on the test set once after training
    (where the other is a validation split: ``plan.tested``);
    ``state()`` the training state after the last step collected (a
    ``tfdp.training.state.TrainingState``: what every backup holds); ``epoch_figures()`` a
    path's own figures of the epoch just trained (for the record, and words for its line)."""

    window = 1
    sync_every = 1

    def batches(self, first_epoch: int, offset: int):
        raise NotImplementedError

    def issue(self, batches, first_step: int, count: int):
        raise NotImplementedError

    def collect(self, pending) -> list:
        raise NotImplementedError

    def evaluate(self, final: bool = False) -> tuple:
        raise NotImplementedError

    def state(self):
        raise NotImplementedError

    def epoch_figures(self) -> tuple:
        return {}, ""


def train(run, steps: Steps) -> int:
    """Train by ``run.plan`` from ``run.first_step``; return the global step reached. After
    every epoch, the run's ``EpochEnd``: evaluation, the report, a backup (``run.backups``). A
    SIGTERM (``run.watch``) stops after the step under way, saved; a non-finite loss stops at
    once."""
    if run.trained:
        return run.first_step
    loop = _Loop(run, steps)
    batches = steps.batches(run.first_epoch, run.offset)
    with run.watch.training(run.first_step):
        for epoch in range(run.first_epoch, run.plan.epochs):
            if loop.epoch(epoch, run.offset if epoch == run.first_epoch else 0, batches):
                break  # --target_accuracy reached.
    run.tracer.finish()  # A traced range past the last step ends with the run.
    return loop.done


class _Running:
    """An epoch's running loss and accuracy, shown on its progress line."""

    def __init__(self, progress):
        self.progress = progress
        self.loss_sum = self.correct = self.seen = 0

    def add(self, loss: float, correct: int, examples: int, position: int) -> None:
        self.loss_sum += loss * examples
        self.correct += correct
        self.seen += examples
        self.progress.update(position, [("loss", self.loss), ("train_acc", self.accuracy)])

    @property
    def loss(self) -> float:
        return self.loss_sum / self.seen

    @property
    def accuracy(self) -> float:
        return self.correct / self.seen


class _Loop:
    def __init__(self, run, steps: Steps):
        self.run, self.steps = run, steps
        self.done = self.issued = run.first_step  # Global steps finished; issued.
        self.in_flight = collections.deque()
        self.divergence = divergence.Divergence()
        self.epoch_end = EpochEnd(run, steps.evaluate, steps.state, steps.epoch_figures)

    def epoch(self, epoch: int, first: int, batches) -> bool:
        """Train ``epoch`` from its step ``first``; whether training is over (its end's)."""
        run, plan = self.run, self.run.plan
        running = _Running(run.reporter.progress(epoch, plan.steps_per_epoch))
        start = time.perf_counter()
        i = first
        while i < plan.steps_per_epoch:
            if run.watch.requested:
                self._drain(running)
                run.watch.stop(self.done, run.backups, self.steps.state)
            if run.backup_interval.due(self.done):  # Of a step every replica finished.
                self._drain(running)
                run.back_up(self.done, self.steps.state)
            # Short at the end of an epoch, and one step a call through a traced range.
            count = min(self.steps.sync_every, plan.steps_per_epoch - i,
                        run.tracer.room(self.issued))
            step = self.issued + 1
            traced = run.tracer.covers(step)
            if traced:  # A traced step runs alone: the steps in flight finish first, untraced.
                self._drain(running)
            with run.tracer.step(step):  # A traced step is collected inside its marker.
                pending = self._watched(self.issued, count, self.steps.issue, batches,
                                        self.issued, count)
                self.in_flight.append((pending, i, count))
                self.issued += count
                i += count
                while self.in_flight and (traced or len(self.in_flight) >= self.steps.window):
                    self._collect(running)
        self._drain(running)
        seconds = time.perf_counter() - start  # Training only: evaluation comes next.
        return self.epoch_end(epoch, self.done, Trained(running.loss, running.accuracy, seconds,
                                                        running.seen, resumed_at=first))

    def _collect(self, running: _Running) -> None:
        pending, i, count = self.in_flight.popleft()
        results = self._watched(self.done, count, self.steps.collect, pending)
        for position, (loss, correct, examples) in enumerate(results, start=i + 1):
            self.divergence.check(loss, self.done + 1, self.run.plan.steps_per_epoch)
            self.done += 1
            self.run.watch.reached(self.done)
            running.add(loss, correct, examples, position)

    def _watched(self, done: int, count: int, call, *args):
        """``call(*args)``, the ``count`` steps after global step ``done``, under the stall
        watchdog."""
        with watching(self.run.stall, _training(done, count)):
            return call(*args)

    def _drain(self, running: _Running) -> None:
        while self.in_flight:
            self._collect(running)


def _training(done: int, count: int) -> str:
    """What a call of ``count`` steps after global step ``done`` is, for the stall watchdog."""
    first = done + 1
    return f"training step {first}" if count == 1 else f"training steps {first}-{done + count}"


def mean_over(batch_sums, examples: int) -> tuple:
    """(mean loss, accuracy, confusion matrix) from ``(summed loss, confusion matrix)`` pairs
    of evaluation batches that cover ``examples`` examples."""
    loss, confusion = 0.0, 0
    for batch_loss, batch_confusion in batch_sums:
        loss += float(batch_loss)
        confusion = confusion + np.asarray(batch_confusion, np.int64)
    return loss / examples, int(np.trace(confusion)) / examples, confusion
