"""What ``fit`` does between steps to lose nothing: backups, divergence, preemption.

``Guard`` is a Keras callback built from the pieces the epoch loop of the other paths uses
(``tfdp.training.divergence``, ``preemption``, ``backups``). After every epoch it writes the
backup. Every ``check_every`` steps and at every epoch's end it reads the loss, and stops the run
once it is non-finite or has exploded (``Diverged``: nothing is exported), then looks for a SIGTERM
(``tfdp.training.preemption.Watch``): if one has come, it saves the state of the step just
finished and raises ``Preempted``. Not after every step: reading a step's loss waits for that
step, and doing so every step made mirrored fit 8 % slower (docs/benchmarks.md).

Under MultiWorkerMirroredStrategy the workers must stop after the *same* step, or the ones still
training wait in their next all-reduce for a peer that has gone. Every ``check_every`` steps, and
at every epoch's end, they all-reduce their SIGTERM flags (one scalar); if any worker has one,
all save that step and stop. The loss needs no such agreement: a non-finite gradient on any
replica reaches every replica through the gradient all-reduce, so every worker stops at that
step or the next (a worker left waiting in a collective is stopped by the launcher, or by
``--collective_timeout``).
"""

import keras
import tensorflow as tf

from tfdp.training import divergence

CHECK_EVERY = 5  # steps between two checks (under multi_worker: SIGTERM all-reduces)


class Guard(keras.callbacks.Callback):
    def __init__(self, watch, backups, distribution, steps_per_epoch: int,
                 check_every: int = CHECK_EVERY):
        super().__init__()
        self.watch, self.backups, self.steps = watch, backups, steps_per_epoch
        self.check_every = check_every
        self._agree = _flag_all_reduce(distribution) if distribution.num_workers > 1 else None
        self._step = None
        self._divergence = divergence.Divergence()

    def on_train_begin(self, logs=None):
        # Counted here: reading the optimizer's counter after every step waits for the step.
        self._step = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self._step % self.check_every == 0:
            self._check(logs)

    def on_epoch_end(self, epoch, logs=None):
        self._check(logs)
        saved = self.backups.save(self._step, self.model.get_weights())
        if self._preempted():
            raise self.watch.preempted(self._step, saved)

    def _check(self, logs):
        """Every few steps: a loss that has become non-finite (it is the epoch's running mean,
        so it stays so), then a SIGTERM anywhere."""
        self._divergence.check(float(logs["loss"]), self._step, self.steps, exact=False)
        self.watch.reached(self._step)
        if self._preempted():
            self.watch.stop(self._step, self.backups, self.model.get_weights)

    def _preempted(self) -> bool:
        if self._agree is None:
            return self.watch.requested
        return bool(self._agree(tf.constant(int(self.watch.requested), tf.int32)).numpy() > 0)


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

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def any_worker(flag):
        return strategy.reduce("SUM", strategy.run(lambda f: f, args=(flag,)), axis=None)

    return any_worker
