"""Replication copies values onto each device; split_batch covers every example exactly once."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import DEVICES
from tfdp.paths.manual.replicate import replicate, shard_sizes, split_batch


@pytest.mark.parametrize("n,k,expected", [(256, 2, [128, 128]), (7, 4, [2, 2, 2, 1]),
                                          (3, 4, [1, 1, 1, 0]), (96, 3, [32, 32, 32])])
def test_shard_sizes(n, k, expected):
    assert shard_sizes(n, k) == expected
    assert [int(s) for s in shard_sizes(tf.constant(n), k)] == expected


@pytest.mark.parametrize("n,k", [(256, 2), (7, 4), (5, 3), (1, 1)])
def test_split_batch_covers_the_batch_once(n, k):
    images = tf.reshape(tf.range(n * 784, dtype=tf.int32), [n, 28, 28, 1])
    labels = tf.range(n, dtype=tf.int64)
    shards = split_batch(images, labels, DEVICES[:k])
    assert len(shards) == k
    np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in shards]), labels.numpy())
    np.testing.assert_array_equal(np.concatenate([x.numpy() for x, _ in shards]), images.numpy())
    for d, (x, y) in enumerate(shards):
        assert x.device.endswith(f"CPU:{d}") and y.device.endswith(f"CPU:{d}")
        assert x.shape[0] == y.shape[0] == shard_sizes(n, k)[d]


def test_replicate_places_equal_copies():
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}
    replicas = replicate(params, DEVICES[:3])
    for d, replica in enumerate(replicas):
        for name, var in replica.items():
            assert var.device.endswith(f"CPU:{d}")
            np.testing.assert_array_equal(var.numpy(), params[name])
    replicas[0]["w"].assign_add(tf.ones([2, 3]))  # Copies, not aliases.
    np.testing.assert_array_equal(replicas[1]["w"].numpy(), params["w"])
