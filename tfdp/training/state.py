"""A run's training state: everything a step's successor needs, described once.

Every save (an epoch's end, a preemption between two steps, on every path) and every restore
(a resume, a test's start) goes through ``TrainingState``, and a backup file is its
``arrays()``. Each path says how to read its state (the from-scratch replicas, a Keras model and
its optimizer, the parameter servers' store) and how to put one back, and nothing else: so a
state that grows (another optimizer slot) grows here, for every path at once.

What is not in it is a function of the global step (saved beside it): the learning rate, the
order of the batches and their flips (of the seed and the epoch), the averages' warm start (the
first step of a run sets them).
"""

import dataclasses
import re

import numpy as np

# A group's arrays in a backup file: "<group>_<i>", i from 0 in the group's order.
GROUPS = ("weights", "slots", "averages", "states")


@dataclasses.dataclass
class TrainingState:
    """``weights``: the model's weights in Keras order (trainable ones and batch
    normalization's statistics); ``slots``: the optimizer's slots in Keras' order, each kind
    (momentum, velocity) for every trainable weight, one kind after the other
    (``tfdp.models.optimizers``; none for plain SGD); ``averages``: the trainable weights'
    averages under ``--ema``, in their order (none without it); ``states``: the model's
    variables that are not weights, in the order of ``model.non_trainable_variables`` (each
    random layer's seed state: Dropout, GaussianNoise, the Random* layers), so that a resumed
    run draws the masks the uninterrupted one draws."""

    weights: list
    slots: list = dataclasses.field(default_factory=list)
    averages: list = dataclasses.field(default_factory=list)
    states: list = dataclasses.field(default_factory=list)

    def arrays(self) -> dict:
        """The state as named numpy arrays (what a backup file holds)."""
        return {f"{group}_{i}": np.asarray(value)
                for group in GROUPS for i, value in enumerate(getattr(self, group))}

    @classmethod
    def from_arrays(cls, arrays) -> "TrainingState":
        """``arrays()`` read back (a mapping, or an open ``.npz``); raises ``ValueError`` for
        arrays that are not a state's (a backup of an older tfdp, say)."""
        names = list(arrays.keys())
        counts = {group: 0 for group in GROUPS}
        for name in names:
            match = re.fullmatch(r"([a-z]+)_(\d+)", name)
            if match and match[1] in counts:
                counts[match[1]] += 1
        if not counts["weights"]:
            raise ValueError("holds no weights (written by another version of tfdp?)")
        return cls(**{group: [arrays[f"{group}_{i}"] for i in range(count)]
                      for group, count in counts.items()})
