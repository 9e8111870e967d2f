"""How a global batch is cut into per-replica shards: the arithmetic every path shares.

A global batch of n examples on k replicas gives shards of n // k, the first n % k one larger,
contiguous and in order (the textbook's ``split_batch``). The manual path cuts with
``tfdp.manual.replicate.split_batch``; the Keras paths get the same shards from
``per_replica_batches``, each example weighted 1 / n so that a replica's weighted loss sum is
its share of the global mean, however the batch was cut.
"""

import tensorflow as tf

# Shards prefetched per pipeline (a shard is a slice of a batch already in memory).
_PREFETCH = 2


def shard_sizes(n, k: int) -> list:
    """Sizes of ``n`` examples split into ``k`` shards as evenly as possible (first ones +1).

    Works on Python ints and on scalar tensors (a batch size known only at run time).
    """
    base, extra = n // k, n % k
    if isinstance(n, int):
        return [base + (1 if i < extra else 0) for i in range(k)]
    return [base + tf.cast(i < extra, n.dtype) for i in range(k)]


def per_replica_batches(global_batches: tf.data.Dataset, num_replicas: int, first: int,
                        count: int) -> tf.data.Dataset:
    """Replicas ``first .. first+count-1``'s shards of each global batch, one element each.

    Elements are ``(images, labels, example_weights)``: every example weighs 1 / global batch
    (float64). ``tf.distribute`` hands consecutive elements to consecutive local replicas.
    """
    def shards(images, labels):
        total = tf.shape(labels, out_type=tf.int64)[0]
        sizes = tf.stack(shard_sizes(total, num_replicas))
        starts = tf.cumsum(sizes, exclusive=True)

        def shard(r):
            return (images[starts[r]:starts[r] + sizes[r]],
                    labels[starts[r]:starts[r] + sizes[r]],
                    tf.fill([sizes[r]], 1.0 / tf.cast(total, tf.float64)))

        return tf.data.Dataset.range(first, first + count).map(shard)

    return global_batches.flat_map(shards).prefetch(_PREFETCH)
