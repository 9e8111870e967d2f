"""``--optimizer``: each from-scratch update (``tfdp.models.optimizers``) is Keras' own, in
float64 over 25 steps at a changing learning rate; every optimizer's flags are its own; and a
run's optimizer is the one it names on every path."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdp.config.optimizer_spec import OPTIMIZERS
from tfdp.config.settings import Config
from tfdp.models.optimizers import Optimizer
from tfdp.util.errors import UserError

SETTINGS = [  # (name, its flags): every optimizer, with its options on and off.
    ("sgd", {}), ("sgd", {"momentum": 0.9}), ("sgd", {"momentum": 0.9, "nesterov": True}),
    ("sgd", {"weight_decay": 1e-2}),
    ("adam", {}), ("adam", {"beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-3}),
    ("adamw", {}), ("adamw", {"weight_decay": 0.05}),
    ("rmsprop", {}), ("rmsprop", {"momentum": 0.5, "rho": 0.8, "weight_decay": 1e-3}),
    ("lion", {}), ("lion", {"beta_1": 0.5, "beta_2": 0.9}),
]


class Rates(keras.optimizers.schedules.LearningRateSchedule):
    """A learning rate that changes every step, as the plan's schedules do."""

    def __call__(self, step):
        return 0.05 / (1.0 + tf.cast(step, tf.float32))


@pytest.mark.parametrize("name, flags", SETTINGS)
def test_the_from_scratch_update_is_keras_own(name, flags):
    config = Config(optimizer=name, **flags)
    mine_settings = Optimizer.of(config)
    assert mine_settings.name == name
    rng = np.random.default_rng(1)
    starts = [rng.normal(size=(3, 4)), rng.normal(size=(4,))]
    mine = {f"w{i}": tf.Variable(s) for i, s in enumerate(starts)}
    theirs = [keras.Variable(s) for s in starts]
    slots = mine_settings.slots(mine)
    optimizer = mine_settings.keras(Rates())
    optimizer.build(theirs)
    assert type(optimizer).__name__ == OPTIMIZERS[name].keras_class
    for step in range(25):
        grads = [rng.normal(size=s.shape) for s in starts]
        lr = Rates()(step)
        for (key, var), grad in zip(mine.items(), grads):
            mine_settings.update(var, tf.constant(grad), lr, slots.get(key, ()),
                                 tf.constant(step, tf.int64))
        optimizer.apply_gradients([(tf.constant(g), v) for g, v in zip(grads, theirs)])
    for var, their in zip(mine.values(), theirs):
        np.testing.assert_allclose(var.numpy(), keras.ops.convert_to_numpy(their),
                                   rtol=1e-12, atol=1e-15)
        assert not np.allclose(var.numpy(), starts[0] if var.shape == (3, 4) else starts[1])
    # The slots, as a backup holds them: Keras' own, in Keras' order.
    kinds = mine_settings.slot_kinds
    mine_slots = [slots[key][k].numpy() for k in range(len(kinds)) for key in mine]
    their_slots = [keras.ops.convert_to_numpy(v) for kind in kinds
                   for v in getattr(optimizer, kind)]
    assert len(mine_slots) == len(their_slots) == 2 * len(kinds)
    for a, b in zip(mine_slots, their_slots):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_each_optimizer_takes_keras_defaults_and_refuses_what_it_does_not_take():
    adam = Config(optimizer="adam")
    assert (adam.lr, adam.beta_1, adam.beta_2, adam.epsilon, adam.weight_decay) == (
        0.001, 0.9, 0.999, 1e-7, 0.0)
    assert Config(optimizer="adamw").weight_decay == 0.004
    assert Config(optimizer="rmsprop").rho == 0.9
    # The textbook's SGD, and a recipe's own choices for its own optimizer.
    assert (Config().optimizer, Config().lr) == ("sgd", 0.2)
    fast = Config(recipe="fast", optimizer="sgd")
    assert (fast.momentum, fast.nesterov) == (0.9, True)
    # Another optimizer under the fast recipe: Keras' rate, no Nesterov.
    assert (Config(recipe="fast", optimizer="adam").lr,
            Config(recipe="fast", optimizer="adam").nesterov) == (0.001, False)
    assert Config(optimizer="adam", lr=0.01).lr == 0.01
    for flags, message in [
            ({"optimizer": "adagrad"}, "--optimizer=adagrad is not one of: sgd, adam, adamw, "
                                       "rmsprop, lion"),
            ({"optimizer": "adam", "momentum": 0.9},
             "--momentum=0.9 is not a setting of --optimizer=adam, which takes --beta_1, "
             "--beta_2, --epsilon"),
            ({"optimizer": "sgd", "beta_1": 0.9}, "--beta_1=0.9 is not a setting of "
                                                  "--optimizer=sgd, which takes --momentum"),
            ({"optimizer": "adam", "beta_2": 1.5}, "--beta_2 must be in [0, 1), got 1.5"),
            ({"optimizer": "rmsprop", "epsilon": -1.0}, "--epsilon must be a positive number"),
            ({"optimizer": "adam", "strategy": "parameter_server"},
             "--optimizer=adam: asynchronous SGD applies each worker's gradients")]:
        with pytest.raises(UserError, match=None) as caught:
            Config(**flags)
        assert message in str(caught.value)


def test_the_runs_line_names_an_optimizer_other_than_the_textbooks():
    from tfdp.config.plan import make_plan

    assert "; adam, lr 0.001; float32;" in make_plan(Config(optimizer="adam"), 2, 60000,
                                                      10000).describe("engine")
    assert "; lr 0.2; float32;" in make_plan(Config(), 2, 60000, 10000).describe("engine")
