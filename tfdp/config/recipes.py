"""``--recipe``: a named set of training choices, each also a flag of its own.

``textbook`` is the chapter's: LeNet, plain SGD at a constant rate, batch 256, no smoothing, no
augmentation (its figures are the chapter's). ``fast`` is what the time-to-accuracy figure is
measured with (docs/time-to-accuracy.md): LeNet with batch normalization (the book's section on
batch normalization trains one), Glorot initialisation, Nesterov momentum with weight decay, a
one-cycle learning rate over the run's epochs up to a higher peak, label smoothing, random
horizontal flips in training and the flipped image averaged in at evaluation, an average of the
weights evaluated and exported, and bfloat16 where this machine's measured speed makes it pay
(``--precision=auto``).

A recipe is a whole configuration, its length included: ``fast``'s epochs are the ones its
time to accuracy is measured with (``tfdp.bench --time_to_accuracy``).

A flag given explicitly wins over its recipe's value; what the run used is in ``metrics.json``
(``config``). Choices a path cannot take are refused in one line (``tfdp.config.checks``), and
a path may take other values of some choices instead (``fast`` on the parameter-server path
keeps only what asynchronous SGD can take; under tf.distribute it is 3 epochs long): it says
which (``tfdp.paths``).
"""

from tfdp import paths
from tfdp.config import optimizer_spec as optimizers

# The recipe's choices that belong to its optimizer.
OPTIMIZER_CHOICES = ("lr", "momentum", "nesterov", "weight_decay")

RECIPES = {
    "textbook": {"model": "lenet", "optimizer": "sgd", "batch_size": 256, "lr": 0.2, "momentum": 0.0,
                 "nesterov": False, "weight_decay": 0.0, "schedule": "constant",
                 "label_smoothing": 0.0, "augment": "none", "eval_flip": False,
                 "precision": "float32", "ema": 0.0, "epochs": 10, "one_cycle_rise": 0.25},
    "fast": {"model": "lenet_bn", "optimizer": "sgd", "batch_size": 128, "lr": 0.5, "init": "glorot",
             "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4, "schedule": "one_cycle",
             "one_cycle_rise": 0.15, "label_smoothing": 0.1, "augment": "flip",
             "eval_flip": True, "precision": "auto", "ema": 0.975, "epochs": 2},
}

def choices(recipe: str, strategy: str, optimizer: str = None) -> dict:
    """The values ``recipe`` gives the flags left unset, on ``strategy`` (whose path may take
    others instead: ``tfdp.paths.Path.recipe_overrides``). An ``optimizer`` other than
    the recipe's brings its own defaults (Keras': ``tfdp.models.optimizers``) in place of the
    recipe's learning rate, momentum and weight decay, which were chosen for the recipe's."""
    chosen = {**RECIPES[recipe], **paths.get(strategy).recipe_overrides.get(recipe, {})}
    if optimizer is None or optimizer == chosen["optimizer"]:
        return {**optimizers.defaults(chosen["optimizer"]), **chosen}
    own = optimizers.defaults(optimizer)
    return {**{k: v for k, v in chosen.items() if k not in OPTIMIZER_CHOICES},
            "momentum": 0.0, "nesterov": False, "weight_decay": 0.0, **own,
            "optimizer": optimizer}


def changed(config) -> list:
    """The choices of ``config``'s recipe that its path changed in ``config`` (a flag given
    explicitly is the user's, not the path's), as ``flag=value to other``, for one log line."""
    recipe = RECIPES[config.recipe]
    overrides = paths.get(config.strategy).recipe_overrides.get(config.recipe, {})
    return [f"{name}={recipe[name]} to {value}" for name, value in overrides.items()
            if recipe.get(name) != value == getattr(config, name)]
