"""Which step a ``multi_worker`` worker holds whole when a peer is lost, and its state then.

A lost peer makes a survivor's step fail at its next collective, and what the step had done by
then stays done. tfdp's step (``train_step.py``) runs in this order: this module's copy of what
the forward pass moves (``model.non_trainable_variables``: batch normalization's statistics,
the random layers' seed states), the mark of the step begun, the forward pass (which moves
them; a synchronised batch normalization's collectives), the gradients' all-reduce, the
optimizer's updates of the weights, its slots, its averages and its step counter, the mark of
the step finished, and only then the logs, which Keras all-reduces. The weights change only
once every gradient has come, and no collective can fail while they do; so after a loss:

* the two marks agree: the step finished, and the next had not begun: the worker holds it;
* the step begun is one past the step finished: it failed before any weight changed, and the
  worker holds the step before it, with what the forward pass moved taken from the copy.

The marks and the copy are each replica's own (``ON_READ``) and are read on the worker's first
replica, as ``training_state`` reads the model's weights: no collective, which a lost peer would
fail. The copy is a few small tensors a step (the statistics and seed states only), made only
where the launcher re-forms the group (``tfdp.launcher.elastic``).
"""

import contextlib

import keras
import numpy as np
import tensorflow as tf

from tfdp.cluster.stall import PEER_LOST
from tfdp.models.stateless import state_variables
from tfdp.paths.keras.callback import training_state
from tfdp.training.state import TrainingState
from tfdp.training.survivors import keep_survivors_step
from tfdp.util.logs import logger

_PER_REPLICA = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


class WholeStep:
    """The marks and the copy for a compiled ``model`` (a ``train_step.GlobalBatchModel``)
    whose optimizer is built; made in the strategy's scope."""

    def __init__(self, model, strategy):
        self.model, self.strategy = model, strategy
        self.moved = list(model.non_trainable_variables)
        self._groups = {}  # dtype -> the indices in ``moved`` of its variables.
        for i, v in enumerate(self.moved):
            self._groups.setdefault(tf.as_dtype(v.dtype), []).append(i)
        self._copies = {dtype: tf.Variable(tf.zeros([sum(_size(self.moved[i]) for i in group)],
                                                    dtype), name="whole_step_copy", **_PER_REPLICA)
                        for dtype, group in self._groups.items()}
        self._began = tf.Variable(tf.zeros([], tf.int64), name="whole_step_began", **_PER_REPLICA)
        self._finished = tf.Variable(tf.zeros([], tf.int64), name="whole_step_finished",
                                     **_PER_REPLICA)

    def start_at(self, step: int) -> None:
        """Before the first step (``step``: the optimizer's counter then): nothing in flight."""
        self._began.assign(step)
        self._finished.assign(step)

    def begins(self):
        """In the step, before its forward pass: the copy, then the mark of the step begun
        (returned: the forward pass must wait for it)."""
        copied = [self._copies[dtype].assign(tf.concat(
            [tf.reshape(_value(self.moved[i]), [-1]) for i in group], 0))
            for dtype, group in self._groups.items()]
        with tf.control_dependencies(copied):
            return self._began.assign(_value(self.model.optimizer.iterations) + 1)

    def ends(self, logs: dict) -> dict:
        """In the step, after the optimizer's updates: the mark of the step finished, once
        every variable the updates write has been written; ``logs`` to wait for it."""
        optimizer = self.model.optimizer
        written = [tf.identity(_value(v))
                   for v in list(self.model.trainable_variables) + list(optimizer.variables)]
        with tf.control_dependencies(written):
            finished = self._finished.assign(_value(optimizer.iterations))
        with tf.control_dependencies([finished]):
            return tf.nest.map_structure(tf.identity, logs)

    def held(self) -> tuple:
        """After a loss (eagerly, on this worker only): (the step this worker holds whole,
        ``read()`` -> its ``TrainingState``)."""
        began, finished = (int(self._local(v).numpy()) for v in (self._began, self._finished))
        if began == finished:
            return finished, lambda: training_state(self.model)
        return finished, self._before_the_step_in_flight

    def _before_the_step_in_flight(self) -> TrainingState:
        """The state with what the failed step's forward pass moved put back from the copy."""
        copied = {}
        for dtype, group in self._groups.items():
            flat = self._local(self._copies[dtype]).numpy()
            offsets = np.cumsum([0] + [_size(self.moved[i]) for i in group])
            for i, start, end in zip(group, offsets[:-1], offsets[1:]):
                copied[id(self.moved[i])] = flat[start:end].reshape(self.moved[i].shape)
        state = training_state(self.model)
        weights = [copied.get(id(v), value) for v, value in
                   zip(self.model.weights, state.weights)]
        states = [copied[id(v)] for v in state_variables(self.model)]
        return TrainingState(weights, state.slots, state.averages, states)

    def _local(self, variable):
        return self.strategy.experimental_local_results(variable)[0]


@contextlib.contextmanager
def keeping_survivors_step(model, run, worker_index: int):
    """Where the group goes on (``model.whole_step``): a peer lost while the block trains,
    this worker backs up the step it holds whole before the loss ends the run."""
    try:
        yield
    except PEER_LOST:
        if model.whole_step is not None and run.backups is not None:
            holder = f"worker {worker_index}"
            try:
                step, read = model.whole_step.held()
            except tf.errors.OpError as e:
                logger.info("%s could not read which step it holds (%s): the newest backup is "
                            "the one to go on from", holder, type(e).__name__)
            else:
                keep_survivors_step(run, step, read, holder, spread=True)
        raise


def _value(variable):
    """A Keras variable's TensorFlow value (this replica's, in a replica's context)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _size(variable) -> int:
    return int(np.prod(variable.shape))
