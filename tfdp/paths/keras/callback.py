"""tfdp's one callback for Keras ``fit``: the progress line, the checks every few steps, and the
run's ``EpochEnd`` (``tfdp.training.epoch_end``), the same end every other path's epochs have.

``FitCallback`` draws the shared reporter's progress line (fit runs with ``verbose=0``: Keras'
own bar would print its line around tfdp's and under other metric names). Every
``check_every`` steps and at every epoch's end it reads the loss, and stops the run once it is
non-finite or has exploded (``Diverged``: nothing is exported), then looks for a SIGTERM
(``tfdp.training.preemption.Watch``): if one has come, it saves the state of the step just
finished (the whole ``training_state``, as an epoch's end does) and raises ``Preempted``. A
check that falls on an epoch's last step leaves the stop to the epoch's end, which evaluates
and records the epoch first (a resumed run starts after it and would never record it). Not
after every step: reading a step's loss waits for that step, and doing so every step made
mirrored fit 8 % slower (docs/benchmarks.md). The replicas' arrival times (stragglers, the
flight recorder) are sampled at those same checks, where the step is waited for already.

Under MultiWorkerMirroredStrategy the workers must stop after the *same* step, or the ones still
training wait in their next all-reduce for a peer that has gone. At every check, and at every
epoch's end, they all-reduce their SIGTERM flags with their backup-due flags (``--backup_every``
in time: their clocks differ); if any worker has one, all save that step and stop, or back it
up and go on. The loss needs no such agreement: a non-finite gradient on any replica
reaches every replica through the gradient all-reduce, so every worker stops at that step or the
next (a worker left waiting in a collective is stopped by the launcher, or by
``--collective_timeout``).
"""

import time

import keras
import tensorflow as tf

from tfdp.models.optimizers import Optimizer
from tfdp.models.stateless import state_variables
from tfdp.paths.keras.evaluation import averages_of
from tfdp.paths.keras.train_step import ARRIVALS
from tfdp.trace.arrivals import unfold
from tfdp.training import divergence
from tfdp.training.epoch_end import EpochEnd
from tfdp.training.report import Trained
from tfdp.training.state import TrainingState

CHECK_EVERY = 5  # steps between two checks (under multi_worker: the flags' all-reduce)



def training_state(model) -> TrainingState:
    """A compiled ``model``'s training state: its weights, its optimizer's slots (each kind
    in the order of the trainable variables, as ``tfdp.models.optimizers`` lists them), the
    averages of ``use_ema`` and the seed states."""
    optimizer = model.optimizer
    return TrainingState(model.get_weights(), _values(slots_of(optimizer)),
                         _values(averages_of(optimizer)), _values(state_variables(model)))


def restore_state(model, state: TrainingState) -> None:
    """``state`` into a compiled ``model`` whose optimizer is built (in the strategy's scope).
    Slots and states the state has none of (a test's start) keep the optimizer's and the
    model's own start."""
    model.set_weights(state.weights)
    optimizer = model.optimizer
    for variables, values in ((slots_of(optimizer), state.slots),
                              (averages_of(optimizer), state.averages),
                              (state_variables(model), state.states)):
        for variable, value in zip(variables, values):
            variable.assign(value)


def slots_of(optimizer) -> list:
    """The slot variables of a built Keras optimizer of ``tfdp.models.optimizers``, in a
    backup's order."""
    kinds = Optimizer.of_keras(optimizer).slot_kinds
    return [v for kind in kinds for v in getattr(optimizer, kind)]


def _values(variables) -> list:
    return [v.numpy() for v in variables]


class FitCallback(keras.callbacks.Callback):
    """``run``: the started run (``tfdp.training.lifecycle.Run``); ``evaluate()`` -> (test
    loss, test accuracy); ``arrivals``: the replicas' ``tfdp.trace.arrivals.Arrivals``, or
    None where there is one replica."""

    def __init__(self, run, distribution, evaluate, arrivals=None,
                 check_every: int = CHECK_EVERY):
        super().__init__()
        plan = run.plan
        self.run, self.arrivals, self.check_every = run, arrivals, check_every
        self.steps, self.batch = plan.steps_per_epoch, plan.global_batch
        self.examples = min(plan.steps_per_epoch * plan.global_batch, plan.train_examples)
        self.resumed_at = run.offset  # Where the first epoch starts when a run resumes in it.
        self._agree = _flag_all_reduce(distribution) if distribution.num_workers > 1 else None
        self._divergence = divergence.Divergence()
        self.epoch_end = EpochEnd(run, evaluate, self._state,
                                  arrivals.epoch_figures if arrivals is not None else None,
                                  self._preempted)
        self._step = None

    def on_train_begin(self, logs=None):
        # Counted here: reading the optimizer's counter after every step waits for the step.
        self._step = int(self.model.optimizer.iterations.numpy())
        if self._preempted():  # A signal while the model was built and compiled.
            self.run.watch.stop(self._step, self.run.backups, self._state)

    def on_epoch_begin(self, epoch, logs=None):
        self._progress = self.run.reporter.progress(epoch, self.steps)
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        checked = self._step % self.check_every == 0
        if checked and self.arrivals is not None and ARRIVALS in logs:
            self.arrivals.add(self._step, unfold(logs[ARRIVALS], time.time()))
        if self._progress.wanted:  # Otherwise reading the logs would wait for the step: skip.
            self._progress.update(self.resumed_at + batch + 1,
                                  [("loss", float(logs["loss"])),
                                   ("train_acc", float(logs["accuracy"]))])
        if checked:
            # At an epoch's last step the epoch's end stops the run, after its record.
            self._check(logs, last=self.resumed_at + batch + 1 == self.steps)

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._start  # Training only: evaluation comes next.
        self._read_loss(logs)
        examples = min((self.steps - self.resumed_at) * self.batch, self.examples)
        if self.epoch_end(epoch, self._step, Trained(logs["loss"], logs["accuracy"], seconds,
                                                     examples, resumed_at=self.resumed_at)):
            self.model.stop_training = True  # --target_accuracy reached: fit ends here.
        self.resumed_at = 0

    def _read_loss(self, logs):
        """Stop at a loss that has become non-finite or exploded (it is the epoch's running
        mean, so it stays so); the step reached, for a signal's message."""
        self._divergence.check(float(logs["loss"]), self._step, self.steps, exact=False)
        self.run.watch.reached(self._step)

    def _check(self, logs, last: bool):
        """Every few steps: the loss, then a SIGTERM anywhere, then a backup due
        (``--backup_every``); not at the epoch's ``last`` step: ``EpochEnd`` evaluates and
        records the epoch, backs it up, then stops if asked."""
        self._read_loss(logs)
        if last:
            return
        stop, due = self._agreed()
        if stop:
            self.run.watch.stop(self._step, self.run.backups, self._state)
        if due:
            self.run.back_up(self._step, self._state)

    def _state(self) -> TrainingState:
        """What every save holds, at an epoch's end or between two steps."""
        return training_state(self.model)

    def _preempted(self) -> bool:
        return self._agreed()[0]

    def _agreed(self) -> tuple:
        """(stop, back up): whether a signal has come, and whether a backup is due, here or,
        under MultiWorkerMirroredStrategy, on any worker (one all-reduce of both flags)."""
        flags = (self.run.watch.requested, self.run.backup_interval.due(self._step))
        if self._agree is None:
            return flags
        summed = self._agree(tf.constant([int(f) for f in flags], tf.int32)).numpy()
        return bool(summed[0] > 0), bool(summed[1] > 0)


class TraceSteps(keras.callbacks.Callback):
    """``--trace_steps`` under ``fit``: the run's ``Tracer`` marks each traced step (a call of
    ``--steps_per_execution`` steps under ``plain``), from ``first_step``, the global step the
    run starts after."""

    def __init__(self, tracer, first_step: int):
        super().__init__()
        self.tracer, self._step, self._marker = tracer, first_step, None

    def on_train_batch_begin(self, batch, logs=None):
        self._step += 1
        self._marker = self.tracer.step(self._step)
        self._marker.__enter__()

    def on_train_batch_end(self, batch, logs=None):
        self._marker.__exit__(None, None, None)


def _flag_all_reduce(distribution):
    strategy = distribution.strategy

    @tf.function(input_signature=[tf.TensorSpec([2], tf.int32)])
    def any_worker(flag):
        return strategy.reduce("SUM", strategy.run(lambda f: f, args=(flag,)), axis=None)

    return any_worker
