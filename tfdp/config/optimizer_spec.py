"""``--optimizer``'s choices, without importing anything: Keras 3's optimizers by their Keras
names, each with Keras' defaults and the flags it takes, declared once. The config's defaults,
checks and help read them; ``tfdp.models.optimizers`` writes each one's update out for the
from-scratch steps and makes Keras' own for ``fit``.
"""

import dataclasses
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class Kind:
    """One optimizer as tfdp knows it: Keras' class name, and its defaults (the flags' values
    when not given: ``lr``, and the hyperparameters it takes: a flag it has no default for is
    one it does not take)."""
    keras_class: str
    defaults: Mapping[str, float]
    summary: str


OPTIMIZERS = {
    "sgd": Kind("SGD", {"momentum": 0.0, "nesterov": False},
                "stochastic gradient descent, with --momentum and --nesterov (the textbook's)"),
    "adam": Kind("Adam", {"lr": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7,
                          "weight_decay": 0.0},
                 "Adam (--beta_1, --beta_2, --epsilon)"),
    "adamw": Kind("AdamW", {"lr": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7,
                            "weight_decay": 0.004},
                  "Adam with decoupled weight decay on by default (--weight_decay 0.004)"),
    "rmsprop": Kind("RMSprop", {"lr": 0.001, "rho": 0.9, "momentum": 0.0, "epsilon": 1e-7,
                                "weight_decay": 0.0},
                    "RMSprop (--rho, --momentum, --epsilon)"),
    "lion": Kind("Lion", {"lr": 0.001, "beta_1": 0.9, "beta_2": 0.99, "weight_decay": 0.0},
                 "Lion (--beta_1, --beta_2)"),
}
# The hyperparameters some optimizers take; each optimizer's defaults say which.
HYPERPARAMETERS = ("momentum", "nesterov", "beta_1", "beta_2", "rho", "epsilon")


def help_text() -> str:
    return ("The optimizer, with Keras' names and defaults: "
            + "; ".join(f"{name}: {kind.summary}" for name, kind in OPTIMIZERS.items())
            + ". Any of them takes --lr (default: the recipe's for sgd, Keras' 0.001 for the "
            "others), the schedules, --weight_decay and --ema (docs/your-model.md). Default: the "
            "recipe's (sgd).")


def defaults(name: str) -> dict:
    """The values ``name`` gives the flags it takes and the user left unset; the
    hyperparameters it does not take stay unset (None)."""
    return dict(OPTIMIZERS[name].defaults)


def takes(name: str, flag: str) -> bool:
    return flag in OPTIMIZERS[name].defaults
