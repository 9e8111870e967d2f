"""The model's variables on the parameter servers: the textbook's (key, value) store.

The variables are made under ``ParameterServerStrategy``, so they live on the servers. The
strategy's own round robin puts every one of LeNet's weight matrices, or every ResNet kernel,
on server 0 and every bias on server 1: ``balanced`` spreads them by size instead, or
``--ps_shards=n`` splits each large one into up to n shards (``MinSizePartitioner``). A step
pulls by reading them and pushes ``v -= lr * grad`` to each (``Store.trainable``), on the
server, in one operation, and once per step however often the step runs (its worker lost after
pushing, the step run again on another): beside each variable the server keeps the numbers of
the steps whose push reached it (``Store.marks``).
"""

import collections
import contextlib

import numpy as np
import tensorflow as tf

from tfdp.data import pipeline
from tfdp.models import catalog, lenet
from tfdp.models.loss import own_losses
from tfdp.models.precision import input_dtype
from tfdp.models.stateless import state_variables

# A parameter smaller than this stays whole under --ps_shards: only W2 and W3 of LeNet are
# worth splitting (100 KB and 410 KB; the rest are 5 KB or less).
MIN_SHARD_BYTES = 32 << 10
# Steps a push's mark is remembered for: far more than can be in flight (two per worker) or be
# retried, so a step that runs again finds its own mark, never a later step's.
MARKS = 1024


def make_store(config, strategy, servers: int, dataset, state=None):
    """The model's variables for ``dataset`` (``tfdp.data.sources.DatasetInfo``) on the
    ``servers``, from a ``TrainingState`` (a backup's, or a test's start: its Keras-order
    weights and seed states) or the model's own start. Without ``--ps_shards``, spread by size
    (``balanced``); with it, the strategy's partitioner shards and places them."""
    weights = state.weights if state is not None else None
    keras_model = config.model != "lenet"
    if keras_model:
        def build(precision=config.precision, seed=None):
            return catalog.build(config.model, dataset.image_shape, dataset.num_classes,
                                 precision, seed=seed)

        sizes = _creation_sizes(build)
    else:
        params = (lenet.from_keras_weights(weights) if weights is not None else
                  lenet.start_params(config.initializer, config.seed,
                                     np.dtype(config.variable_dtype),
                                     input_shape=dataset.image_shape,
                                     num_classes=dataset.num_classes))
        sizes = [value.nbytes for value in params.values()]
    with strategy.scope():
        # Updates applied so far, on a server too: a step reads it before it pulls and bumps it
        # after it pushes, and the difference is the step's staleness.
        updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
        placing = (balanced(servers, sizes) if config.ps_shards == 1 else
                   contextlib.nullcontext())
        if keras_model:
            with placing:
                model = build(seed=config.seed)
            if weights is not None:
                model.set_weights(weights)
                for variable, value in zip(state_variables(model), state.states):
                    variable.assign(value)
            store = KerasStore(model, config.precision, updates, build)
        else:
            with placing:
                store = LenetStore(params, config.precision, updates, dataset.image_shape)
        store.marks = [_marks_beside(strategy, v) for v in (*store.trainable, updates)]
    return store


def _marks_beside(strategy, variable) -> tf.Variable:
    """``variable``'s applied marks, on its server: slot ``n % MARKS`` holds the last step
    number ``n`` whose push reached it (``step.once``). Step numbers start at 1, so a new
    run's zeros mark nothing."""
    with strategy.extended.colocate_vars_with(variable):
        return tf.Variable(tf.zeros([MARKS], tf.int64), trainable=False,
                           name=f"{variable.name.split(':')[0].replace('/', '_')}_marks")


def _creation_sizes(build) -> list:
    """The byte sizes of the variables ``build()`` makes, in the order it makes them (a dry
    run, here: a Keras model lists its variables in another order)."""
    sizes = []

    def record(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        sizes.append(_nbytes(variable))
        return variable

    with tf.variable_creator_scope(record):
        build()
    return sizes


def _nbytes(variable) -> int:
    return int(np.prod(variable.shape)) * tf.as_dtype(variable.dtype).size


@contextlib.contextmanager
def balanced(servers: int, sizes: list):
    """Place the variables created inside, whose byte sizes in creation order are ``sizes``,
    largest first on the server holding the fewest bytes so far (TensorFlow 1's
    ``GreedyLoadBalancingStrategy``). The strategy's own round robin puts every one of LeNet's
    weight matrices, or every ResNet kernel, on server 0 and every bias on server 1."""
    load, plan = [0] * servers, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        plan[i] = load.index(min(load))
        load[plan[i]] += sizes[i]
    # The strategy places a variable only with another (colocation): one small anchor on each
    # server, made by its round robin.
    anchors = {}
    while len(anchors) < servers:
        anchor = tf.Variable(0, dtype=tf.int8, trainable=False, name="placement_anchor")
        anchors.setdefault(tf.DeviceSpec.from_string(anchor.device).task, anchor)
    created = []

    def creator(next_creator, **kwargs):
        index = len(created)
        if index >= len(plan):
            raise RuntimeError(f"variable {index + 1} was not planned ({len(plan)} were)")
        variable = next_creator(colocate_with=anchors[plan[index]], **kwargs)
        if _nbytes(variable) != sizes[index]:
            raise RuntimeError(f"variable {index + 1} ({variable.name}) is not the one planned "
                               f"({_nbytes(variable)} bytes, not {sizes[index]})")
        created.append(variable)
        return variable

    with tf.variable_creator_scope(creator):
        yield


class Store:
    """The variables on the servers: the textbook's (key, value) store. A step pulls by reading
    them and pushes ``v -= lr * grad`` to each (``trainable``). Subclasses say what the model
    is: ``logits``, ``weights`` (read on the coordinator, Keras order), ``serving_model``,
    ``held``."""

    def __init__(self, precision: str, updates: tf.Variable):
        self.compute = tf.as_dtype(precision)
        self.updates = updates  # The update counter (``make_store``).
        # Beside each of ``trainable`` and ``updates``, in that order: the steps that reached
        # it (``_marks_beside``).
        self.marks = []

    def own_loss(self, dtype):
        """The model's own losses of its last ``logits`` (regularizers, ``add_loss``), summed
        in ``dtype``; 0 for a model without them."""
        return tf.zeros([], dtype)

    def states(self) -> list:
        """The model's seed states (``TrainingState.states``), read on the coordinator."""
        return []

    def bytes_per_server(self, servers: int) -> list:
        held = self.held()
        return [sum(b for _, b in held.get(i, [])) for i in range(servers)]

    def describe(self) -> str:
        return "; ".join(f"ps {server} holds "
                         f"{', '.join(f'{n} ({b / 1e3:.1f} KB)' for n, b in items[:12])}"
                         + (f" and {len(items) - 12} more" if len(items) > 12 else "")
                         + f" = {sum(b for _, b in items) / 1e3:.1f} KB"
                         for server, items in sorted(self.held().items()))


def _held_by(variables) -> dict:
    """Server index -> [(name, bytes)] of ``variables`` (name, variable) pairs."""
    held = collections.defaultdict(list)
    for name, variable in variables:
        server = tf.DeviceSpec.from_string(variable.device).task
        held[server].append((name, int(np.prod(variable.shape)) * variable.dtype.size))
    return held


class LenetStore(Store):
    """The from-scratch LeNet's parameters, each whole or in shards (``--ps_shards``)."""

    def __init__(self, params: dict, precision: str, updates: tf.Variable,
                 input_shape: tuple = lenet.FASHION_MNIST[0]):
        super().__init__(precision, updates)
        self.input_shape = input_shape
        self.variables = {name: tf.Variable(value, name=name) for name, value in params.items()}
        self.shards = {name: list(getattr(v, "variables", [v]))
                       for name, v in self.variables.items()}
        self.trainable = [p for parts in self.shards.values() for p in parts]

    def logits(self, images, training: bool):
        """Every parameter whole (shards concatenated), read from the servers, then LeNet."""
        del training
        params = {name: parts[0].read_value() if len(parts) == 1 else
                  tf.concat([p.read_value() for p in parts], axis=0)
                  for name, parts in self.shards.items()}
        return lenet.logits(params, images, self.compute)

    def weights(self) -> list:
        return lenet.to_keras_weights({name: np.concatenate([p.numpy() for p in parts], axis=0)
                                       for name, parts in self.shards.items()})

    def serving_model(self, weights, precision):
        return lenet.serving_model(lenet.from_keras_weights(weights), precision,
                                   self.input_shape)

    def held(self) -> dict:
        return _held_by((name if len(parts) == 1 else f"{name}[{i + 1}/{len(parts)}]", part)
                        for name, parts in self.shards.items()
                        for i, part in enumerate(parts))


class KerasStore(Store):
    """A Keras model's variables (ResNet-18, or yours): its layers read them, and batch
    normalization updates its statistics, on the servers. ``build(precision)`` makes the model
    again, off the servers, for the export."""

    def __init__(self, model, precision: str, updates: tf.Variable, build):
        super().__init__(precision, updates)
        self.model, self.build = model, build
        # The TensorFlow variables under Keras' own: their assign_sub runs on the server, in
        # one step (Keras' assign_sub reads, subtracts and writes back the whole value from the
        # worker, losing the updates other workers make in between).
        self.trainable = [v.value for v in model.trainable_variables]
        self.input_dtype = input_dtype(precision)

    def logits(self, images, training: bool):
        logits = self.model(pipeline.to_float(images, self.input_dtype), training=training)
        return tf.cast(logits, tf.float32)

    def own_loss(self, dtype):
        return own_losses(self.model.losses, dtype)

    def weights(self) -> list:
        return self.model.get_weights()

    def states(self) -> list:
        return [v.numpy() for v in state_variables(self.model)]

    def serving_model(self, weights, precision):
        """The same model made here, off the servers, holding the trained weights."""
        model = self.build(precision)
        model.set_weights(weights)
        return model

    def held(self) -> dict:
        return _held_by((v.path, v.value) for v in self.model.variables)
