"""Every allreduce gives every device the sum, for 1..4 devices and awkward sizes."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import DEVICES
from tfdp.paths.manual.allreduce import ALLREDUCE

# Shapes chosen so flattened totals are odd, smaller than k, and not divisible by 3 or 4.
SHAPES = [(3, 3, 1, 5), (5,), (1,), (7, 3), (2,)]


@pytest.mark.parametrize("name", sorted(ALLREDUCE))
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_allreduce_matches_add_n_on_every_device(name, k):
    devices = DEVICES[:k]
    rng = np.random.default_rng(k)
    values = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in devices]
    grads = []
    for device, per_device in zip(devices, values):
        with tf.device(device):
            grads.append([tf.constant(v) for v in per_device])
    expected = [tf.add_n([tf.constant(values[d][i]) for d in range(k)]).numpy()
                for i in range(len(SHAPES))]

    out = ALLREDUCE[name](grads, devices)

    assert len(out) == k
    for d, per_device in enumerate(out):
        for i, tensor in enumerate(per_device):
            assert tensor.shape == SHAPES[i]
            assert tensor.device.endswith(f"CPU:{d}"), (name, d, tensor.device)
            np.testing.assert_allclose(tensor.numpy(), expected[i], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(ALLREDUCE))
def test_allreduce_inside_tf_function(name):
    devices = DEVICES[:3]

    @tf.function
    def reduce(a, b, c):
        return ALLREDUCE[name]([[a], [b], [c]], devices)

    a, b, c = (tf.fill([11], float(v)) for v in (1, 2, 4))
    for per_device in reduce(a, b, c):
        np.testing.assert_array_equal(per_device[0].numpy(), np.full(11, 7.0, np.float32))
