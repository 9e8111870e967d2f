"""``--model``'s value, without importing anything: one of tfdp's models, or your own Keras
model's function as ``package.module:function`` or ``path/to/file.py:function``
(``tfdp.models.catalog`` imports and builds it).

``check_spec`` checks its form when the config is made; ``name_of`` is what folders call it;
``spec_of`` names a function given to ``tfdp.run(model=...)``.
"""

import importlib
import os
import re

from tfdp.util.errors import UserError

LENETS = ("lenet", "lenet_bn")  # The built-ins that start from --init.
BUILT_IN = (*LENETS, "resnet18")
OWN_BATCH_NORM = ("lenet_bn", "resnet18")  # The built-ins --sync_batch_norm synchronizes.
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*$")
# Functions given to tfdp.run that no import reaches (a lambda, a function defined in another
# function): found by their spec, in this process only.
GIVEN = {}


def is_own(spec: str) -> bool:
    """Whether ``spec`` names a function of the user's rather than a built-in model."""
    return spec not in BUILT_IN


def name_of(spec: str) -> str:
    """What run folders and export folders call the model: a built-in's name, or the
    function's."""
    if not is_own(spec):
        return spec
    return spec.rpartition(":")[2].partition("@")[0].rpartition(".")[2]


def spec_of(function) -> str:
    """The spec of a Python function given to ``tfdp.run(model=...)``: ``module:name`` where
    an import finds it again (so that launched processes can), else one kept in this
    process."""
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if module and all(IDENTIFIER.match(part) for part in qualname.split(".")):
        spec = f"{module}:{qualname}"
        try:
            if attribute(importlib.import_module(module), qualname) is function:
                return spec
        except (ImportError, AttributeError):
            pass
    spec = f"{module or 'python'}:{qualname or 'model'}@{id(function):x}"
    GIVEN[spec] = function
    return spec


def spec_of_instance(model) -> str:
    """The spec of a Keras model instance given to ``tfdp.run(model=...)``: kept in this
    process (``tfdp.models.catalog`` copies it where a run builds its model), named after the
    model."""
    spec = f"instance:{model.name}@{id(model):x}"
    GIVEN[spec] = model
    return spec


def is_instance(spec: str) -> bool:
    """Whether ``spec`` names a model instance (``spec_of_instance``)."""
    return spec.startswith("instance:") and spec in GIVEN


def is_keras_model(value) -> bool:
    """Whether ``value`` is a Keras model instance (without importing Keras)."""
    return any(c.__module__.startswith("keras") and c.__name__ == "Model"
               for c in type(value).__mro__)


def check_spec(spec: str) -> None:
    """The form of ``--model`` (nothing imported yet): a built-in, ``module:function`` or
    ``file.py:function`` with the file there."""
    if not is_own(spec) or spec in GIVEN:
        return
    where, colon, function = spec.rpartition(":")
    if not colon or not where or not all(IDENTIFIER.match(p) for p in function.split(".")):
        raise UserError(f"--model={spec}: give {', '.join(BUILT_IN)}, package.module:function "
                        "or path/to/file.py:function (a function of input_shape and "
                        "num_classes returning a Keras model)")
    if where.endswith(".py") and not os.path.isfile(where):
        raise UserError(f"--model={spec}: there is no file {where}")


def attribute(module, qualname: str):
    value = module
    for part in qualname.split("."):
        value = getattr(value, part)
    return value
