"""``--model``: one of tfdp's models, or your own Keras model.

The built-ins are ``lenet`` (the textbook's), ``lenet_bn`` (with batch normalization) and
``resnet18``. Your own is a function ``function(input_shape, num_classes)`` returning a Keras
model that takes float images in [0, 1] of ``input_shape`` (H, W, C) and returns
``num_classes`` logits, named ``package.module:function`` (imported as Python imports it) or
``path/to/file.py:function`` (loaded from the file). From Python, ``tfdp.run(model=function)``
takes the function itself.

``build(spec, ...)`` makes the Keras model in a ``--precision`` (Keras' global float type and
dtype policy are the precision's while the function runs, so an ``Input`` and the layers that
do not set a dtype follow it);
``function_of`` imports the function; each failure is one line. (The spec's form is checked
when the config is made, ``tfdp.config.model_spec``.)
"""

import importlib
import importlib.util
import os
import re
import sys

from tfdp.config.model_spec import GIVEN, attribute, check_spec, is_own
from tfdp.util.errors import UserError


def function_of(spec: str):
    """The user's model function that ``spec`` names, imported (one line when it cannot be)."""
    if spec in GIVEN:
        return GIVEN[spec]
    check_spec(spec)
    where, _, name = spec.rpartition(":")
    try:
        module = _load_file(where) if where.endswith(".py") else importlib.import_module(where)
    except ImportError as e:
        raise UserError(f"--model={spec}: cannot import {where} ({type(e).__name__}: {e})") \
            from None
    try:
        function = attribute(module, name)
    except AttributeError:
        raise UserError(f"--model={spec}: {where} has no {name}") from None
    if not callable(function):
        raise UserError(f"--model={spec}: {name} is a {type(function).__name__}, not a "
                        "function of input_shape and num_classes")
    return function


def build(spec: str, input_shape: tuple, num_classes: int, precision: str = "float32",
          sync_batch_norm: bool = False, seed: int = None):
    """The Keras model ``spec`` names, in ``precision`` (``tfdp.models.precision``), for
    images of ``input_shape`` in ``num_classes`` classes, checked to take and give that; its
    starting weights Keras' initializers' under ``seed`` (``keras.utils.set_random_seed``)
    when given."""
    import keras

    from tfdp.models import lenet, resnet
    from tfdp.models.precision import keras_dtypes

    if seed is not None:
        keras.utils.set_random_seed(seed)
    if spec == "resnet18":
        return resnet.resnet(num_classes=num_classes, sync_batch_norm=sync_batch_norm,
                             precision=precision, input_shape=input_shape)
    if not is_own(spec):
        return lenet.keras_model(num_classes, precision, batch_norm=spec == "lenet_bn",
                                 sync_batch_norm=sync_batch_norm, input_shape=input_shape)
    function = function_of(spec)
    inputs, policy, _ = keras_dtypes(precision)
    before = keras.config.floatx(), keras.config.dtype_policy()
    # The images' dtype (keras.Input's default) and the layers' policy, while the function runs.
    keras.config.set_floatx(inputs)
    keras.config.set_dtype_policy(policy)
    try:
        with replicated_statistics():
            if isinstance(function, keras.Model):  # tfdp.run(model=<a Keras model>).
                model = _copy_of(spec, function, policy)
            else:
                model = called(spec, function, tuple(input_shape), num_classes)
            return _checked(spec, model, tuple(input_shape), num_classes, inputs)
    finally:
        keras.config.set_floatx(before[0])
        keras.config.set_dtype_policy(before[1])


def called(spec: str, function, input_shape: tuple, num_classes: int):
    """``function(input_shape, num_classes)``, its signature checked first; an exception it
    raises is one line naming the function and the error, then the frames of the user's own
    code (none of tfdp's, Keras' or TensorFlow's)."""
    import inspect
    import traceback

    name = getattr(function, "__qualname__", repr(function))
    try:
        inspect.signature(function).bind(input_shape, num_classes)
    except TypeError:
        raise UserError(f"--model={spec}: {name}{inspect.signature(function)} cannot be called "
                        "as function(input_shape, num_classes): give a function of the images' "
                        "shape (H, W, C) and the number of classes") from None
    except ValueError:  # No signature to read (a builtin): let the call say.
        pass
    try:
        return function(input_shape, num_classes)
    except Exception as e:  # The user's code: any exception is theirs to see, briefly.
        frames = [f for f in traceback.extract_tb(e.__traceback__) if _users(f.filename)]
        where = "".join(traceback.format_list(frames)).rstrip()
        raise UserError(f"--model={spec}: {name}{input_shape, num_classes} raised "
                        f"{error_line(e)}" + (f"\n{where}" if where else "")) from None


def error_line(error: Exception) -> str:
    """``Type: the message's first line`` (``Type`` alone when it has none)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _users(filename: str) -> bool:
    """Whether a traceback frame's file is the user's: not tfdp's, an installed package's or
    Python's own."""
    import sysconfig

    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    theirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    path = os.path.abspath(filename)
    return not any(path.startswith(folder + os.sep) for folder in (ours, *theirs))


def _copy_of(spec: str, instance, policy: str):
    """A copy of a Keras model instance given to ``tfdp.run(model=...)``, made where it is
    asked for (in a strategy's scope: its variables are the strategy's), holding the instance's
    weights: they are the run's start. Refused in one line where Keras cannot copy it (a
    subclassed model without ``get_config``) or where it would have to change precision."""
    import keras

    built = instance.dtype_policy.name
    if built != policy:
        raise UserError(f"--model={spec}: a model instance trains in the dtype policy it was "
                        f"built in ({built}), not --precision's ({policy}): give tfdp.run the "
                        "function that builds it instead")
    try:
        model = keras.models.clone_model(instance)
    except Exception as e:  # Keras raises what the model's from_config raises.
        raise UserError(f"--model={spec}: Keras cannot copy this model instance "
                        f"(keras.models.clone_model raised {type(e).__name__}; a subclassed "
                        "model is copied only through its get_config): give tfdp.run the "
                        "function that builds it instead") from None
    model.set_weights(instance.get_weights())
    return model


def replicated_statistics():
    """A scope in which every non-trainable floating-point variable made (batch
    normalization's moving mean and variance, in any layer) is averaged across replicas when
    a replica writes it, as ``tfdp.models.replicated_batch_norm`` makes tfdp's own: under a
    ``MirroredStrategy`` Keras' aggregation ``"none"`` leaves each replica its own
    statistics, and what is exported (replica 0's) is not what the run evaluated."""
    import tensorflow as tf

    def creator(next_creator, **kwargs):
        dtype = kwargs.get("dtype")
        if (not kwargs.get("trainable", True) and dtype is not None
                and tf.as_dtype(dtype).is_floating
                and kwargs.get("aggregation") in (None, tf.VariableAggregation.NONE)):
            kwargs["aggregation"] = tf.VariableAggregation.MEAN
        return next_creator(**kwargs)

    return tf.variable_creator_scope(creator)


def _checked(spec: str, model, input_shape: tuple, num_classes: int, input_dtype: str):
    """``model`` as a functional Keras model (a subclassed one called on an ``Input``: every
    path reads a model's inputs and outputs), checked to map ``input_shape`` to one logit a
    class."""
    import keras

    if not isinstance(model, keras.Model):
        raise UserError(f"--model={spec}: the function returned a {type(model).__name__}, not "
                        "a Keras model")
    try:
        if not getattr(model, "inputs", None):
            inputs = keras.Input(input_shape, dtype=input_dtype)
            model = keras.Model(inputs, model(inputs), name=model.name)
        out = tuple(model.outputs[0].shape)
    except Exception as e:  # Keras raises what the layers raise: any of them is the model's.
        raise UserError(f"--model={spec}: the model does not take images of shape "
                        f"{input_shape} ({error_line(e)})") from None
    if len(model.outputs) == 1:
        model = _logits_beneath(spec, model, input_shape, input_dtype)
    if len(model.outputs) != 1 or out[1:] != (num_classes,):
        raise UserError(f"--model={spec}: the model gives outputs of shape {out[1:]} for "
                        f"images of shape {input_shape}; tfdp needs ({num_classes},): one logit "
                        "per class")
    if tuple(model.inputs[0].shape)[1:] != tuple(input_shape):
        raise UserError(f"--model={spec}: the model takes inputs of shape "
                        f"{tuple(model.inputs[0].shape)[1:]}; the images are {input_shape}")
    return model


SAID = set()  # The specs whose softmax head this process has said it trains beneath.
# Layers whose output, without an activation, is logits: no need to look further.
LINEAR_HEADS = ("Dense", "EinsumDense", "Conv2D", "Conv1D")


def _logits_beneath(spec: str, model, input_shape: tuple, input_dtype: str):
    """``model``, giving the logits beneath its probability head: a last layer whose activation
    is a softmax is made linear, a last ``Softmax`` (layer or operation) or
    ``Activation("softmax")`` is left out; either said in one line (once a process). A model
    whose head cannot be seen (a subclassed model, a custom layer) is tried on two images
    and refused in one line when its outputs are probabilities (rows of non-negative numbers
    that sum to 1): tfdp's loss and its export's ``probabilities`` take the softmax of the
    model's outputs, and would take it twice."""
    import keras
    import numpy as np

    operation, node_index, _ = model.outputs[0]._keras_history
    activation = getattr(operation, "activation", None)
    name = f"--model={spec}: its last layer {operation.name!r}"
    if type(operation).__name__ == "Softmax" or (
            type(operation).__name__ == "Activation" and activation is keras.activations.softmax):
        beneath = operation._inbound_nodes[node_index].input_tensors[0]
        model = keras.Model(model.inputs, beneath, name=model.name)
        _say_once(spec, f"{name} is a softmax: tfdp trains the logits beneath it, and exports "
                        "them with their softmax as the probabilities")
        return model
    if activation is keras.activations.softmax:
        operation.activation = keras.activations.linear
        _say_once(spec, f"{name} has a softmax activation: tfdp trains its logits (the layer "
                        "without it), and exports them with their softmax as the probabilities")
        return model
    if type(operation).__name__ in LINEAR_HEADS and activation is keras.activations.linear:
        return model
    rng = np.random.default_rng(0)
    outputs = np.asarray(keras.ops.convert_to_numpy(model(
        rng.uniform(size=(2, *input_shape)).astype(input_dtype), training=False)), np.float64)
    if (outputs >= 0).all() and np.allclose(outputs.sum(axis=-1), 1, atol=1e-3):
        raise UserError(f"--model={spec}: the model's outputs are probabilities (each row "
                        "sums to 1), and tfdp trains and serves logits: end the model without "
                        "its softmax, or with one tfdp can see and train beneath (a last Dense "
                        "with activation=\"softmax\", a Softmax layer)")
    return model


def _say_once(spec: str, line: str) -> None:
    from tfdp.util.logs import logger

    if spec not in SAID:
        SAID.add(spec)
        logger.info("%s", line)


def _load_file(path: str):
    """The module of a Python file, loaded under a name of its own (its folder on the import
    path while it loads, so that it may import its neighbours)."""
    folder = os.path.dirname(os.path.abspath(path))
    name = "tfdp_model_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except ImportError:
        raise
    except Exception as e:  # The file's own error, at import: one line, the file named.
        raise ImportError(f"{type(e).__name__} while running {path}: {e}") from None
    finally:
        sys.path.remove(folder)
    sys.modules[name] = module
    return module
