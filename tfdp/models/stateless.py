"""A model as the from-scratch step calls it: named variables and a pure forward pass.

The step keeps each replica's variables itself, one copy per device (``tfdp.paths.manual.replicate``),
and asks the model only for ``forward(values, images, training)``: the logits of a batch with
the given values and, in training, the model's state moved by the batch (batch
normalization's moving mean and variance, each random layer's seed state) and its own losses
(``model.losses``: regularizers, ``add_loss``). Two kinds of model answer it:

* ``HandWrittenLeNet``: the textbook's LeNet as plain tensors (the chapter's model,
  ``lenet`` and ``lenet_bn``);
* ``KerasModel``: any Keras model (``resnet18``, or yours), through Keras'
  ``stateless_call``, which computes the layers with the values given instead of the model's
  own variables.

Both list their weights in the order of Keras' ``get_weights`` (``names``), which is the
order of a backup's and an export's weights, and the variables that are not weights
(``states``: seed states) in the order of ``model.non_trainable_variables``.
"""

import numpy as np
import tensorflow as tf

from tfdp.config.model_spec import LENETS
from tfdp.data.pipeline import to_float
from tfdp.models import lenet
from tfdp.models.loss import own_losses


class HandWrittenLeNet:
    """The textbook's LeNet (or, with ``batch_norm``, lenet_bn) as plain tensors
    (``tfdp.models.lenet``): its parameters by name, starting at ``--init``'s of ``seed`` in
    ``dtype``, its logits computed in ``compute`` (default: the parameters' dtype)."""

    def __init__(self, batch_norm: bool = False, compute=None, init: str = "glorot",
                 seed: int = 0, dtype=np.float32, input_shape: tuple = lenet.FASHION_MNIST[0],
                 num_classes: int = lenet.FASHION_MNIST[1]):
        self.batch_norm, self.compute = batch_norm, compute
        self.start = init, seed, dtype
        self.data = tuple(input_shape), num_classes
        self.names = tuple(lenet.shapes(batch_norm, *self.data))
        self.statistics = tuple(name for name in self.names if name in lenet.STATISTICS)
        self.trainable = tuple(name for name in self.names if name not in lenet.STATISTICS)
        self.moving = self.statistics
        self.states = ()
        self.num_classes = num_classes

    @classmethod
    def of(cls, params: dict, compute=None) -> "HandWrittenLeNet":
        """The LeNet whose parameters ``params`` are: lenet_bn's or LeNet's (of Fashion-MNIST's
        shapes, as tests and benchmarks make them)."""
        return cls("g1" in params, compute)

    def initial(self) -> list:
        """The starting weights of ``init`` (``start_params``), in Keras' order."""
        init, seed, dtype = self.start
        return lenet.to_keras_weights(lenet.start_params(init, seed, dtype, self.batch_norm,
                                                         *self.data))

    def initial_states(self) -> list:
        return []

    def forward(self, values: dict, images, training: bool):
        """(logits, {running statistic: moved value}, None) in training, (logits, {}, None)
        else: LeNet has no losses of its own."""
        batch_stats = [] if training and self.batch_norm else None
        out = lenet.logits(values, images, self.compute, batch_stats)
        return out, lenet.moved_statistics(values, batch_stats) if batch_stats else {}, None

    def serving_model(self, weights: list, precision: str):
        return lenet.serving_model(lenet.from_keras_weights(weights), precision, self.data[0])


class KerasModel:
    """A Keras model's variables by name (their Keras paths) and its ``stateless_call``.

    ``names``: its weights (``model.weights``, Keras' ``get_weights`` order); ``trainable``:
    what gradients train; ``statistics``: every other variable ``stateless_call`` takes and
    returns, in the order of ``model.non_trainable_variables`` (batch normalization's running
    statistics, each random layer's seed state); ``moving``: those that move with the batches
    (the floating-point ones); ``states``: the statistics that are not weights (the seed
    states: ``model.weights`` leaves them out). ``build(precision)`` makes the same model again
    in another precision, for the export."""

    def __init__(self, model, build=None):
        self.model, self.build = model, build
        path = {id(v): p for v, p in zip(model.variables, _unique_paths(model.variables))}
        self.names = tuple(path[id(v)] for v in model.weights)
        self.trainable = tuple(path[id(v)] for v in model.trainable_variables)
        self.statistics = tuple(path[id(v)] for v in model.non_trainable_variables)
        self.moving = tuple(path[id(v)] for v in model.non_trainable_variables
                            if "float" in str(v.dtype))
        weights = set(self.names)
        self.states = tuple(name for name in self.statistics if name not in weights)
        self.input_dtype = model.inputs[0].dtype  # catalog.build's models are functional.
        self.num_classes = model.outputs[0].shape[-1]

    def initial(self) -> list:
        """The model's own starting weights (its initializers'), in ``names``' order."""
        return self.model.get_weights()

    def initial_states(self) -> list:
        """The starting values of its ``states`` (each seed generator's seed)."""
        return [v.numpy() for v in state_variables(self.model)]

    def forward(self, values: dict, images, training: bool):
        """(logits in the variables' dtype, {statistic: moved value} in training, else {}, the
        sum of the model's own losses in training, else None) of uint8 ``images``."""
        trainable = [values[name] for name in self.trainable]
        logits, moved, losses = self.model.stateless_call(
            trainable, [values[name] for name in self.statistics],
            to_float(images, tf.as_dtype(self.input_dtype)), training=training,
            return_losses=True)
        dtype = trainable[-1].dtype
        logits = tf.cast(logits, dtype)  # Mixed precision's bfloat16 logits.
        if not training:
            return logits, {}, None
        own = own_losses(losses, dtype) if losses else None
        return logits, dict(zip(self.statistics, moved)), own

    def serving_model(self, weights: list, precision: str):
        """The model with ``weights``, as exported: built again in ``precision`` (float32, or
        mixed bfloat16 like the training) when it can be."""
        model = self.build(precision) if self.build else self.model
        model.set_weights([tf.cast(w, v.dtype).numpy() for w, v in zip(weights, model.weights)])
        return model


def state_variables(model) -> list:
    """The variables of ``model`` that are not weights (``model.weights`` leaves them out) but
    that its calls read and move: each random layer's seed state, in the order of
    ``model.non_trainable_variables``."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.non_trainable_variables if id(v) not in weights]


def _unique_paths(variables) -> list:
    """Each variable's Keras path, numbered where two share one (a model holding a layer
    twice)."""
    seen, paths = {}, []
    for v in variables:
        path = getattr(v, "path", v.name)
        seen[path] = seen.get(path, 0) + 1
        paths.append(path if seen[path] == 1 else f"{path}_{seen[path]}")
    return paths


def for_the_step(config, input_shape: tuple, num_classes: int):
    """The from-scratch step's model for ``config.model``: the hand-written LeNet for
    ``lenet`` and ``lenet_bn`` (computing in ``--precision``, starting at ``--init``), any
    other through Keras, starting at its layers' own initializers under ``--seed``."""
    from tfdp.models import catalog

    spec, precision, seed = config.model, config.precision, config.seed
    if spec in LENETS:
        return HandWrittenLeNet(spec == "lenet_bn", precision, config.initializer, seed,
                                 np.dtype(config.variable_dtype), input_shape, num_classes)
    def build(precision_, seed_=None):
        return catalog.build(spec, input_shape, num_classes, precision_, seed=seed_)

    return KerasModel(build(precision, seed), build)
