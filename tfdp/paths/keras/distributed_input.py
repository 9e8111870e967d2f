"""Fashion-MNIST global batches as per-replica input for Keras ``fit`` under any strategy.

``distribute(strategy, global_batches, replicas)`` cuts each global batch into per-replica
shards exactly like the manual path's ``split_batch`` (``tfdp.config.plan.shard_sizes``), as
``(images, labels, example_weights)``; ``tfdp.paths.keras.train_step`` trains on those.

Each replica reads an iterator of its own (``InputReplicationMode.PER_REPLICA``) rather than one
``MultiDeviceIterator`` per worker, which costs a noticeable share of a LeNet step
(docs/benchmarks.md, "Input per replica"). TF accepts PER_REPLICA only in MirroredStrategy's
``distribute_datasets_from_function``; MultiWorkerMirroredStrategy raises NotImplementedError
(``collective_all_reduce_strategy.py``), although the rest of its implementation is the same
call to ``input_util.get_distributed_datasets_from_function``. We make that call ourselves, as
MirroredStrategy does, when each worker has exactly one replica (every CPU worker). With more
devices per worker, or if TF's internals have moved, we fall back to the public PER_WORKER
input. ``tests/test_multi_worker.py`` checks that TF still refuses the public way.

Every input is repeated: callers take exactly the batches they need (fit stops at
``steps_per_epoch`` x ``epochs``, the evaluator at its ``steps``), and an input that never
ends spares tf.distribute an all-reduce every step to check that every replica still has
data (``_enable_get_next_as_optional`` in tf.distribute's input_lib): under
MultiWorkerMirroredStrategy one more cross-process collective per step.
"""

import tensorflow as tf

from tfdp.config.plan import shard_sizes
from tfdp.data.pipeline import to_float
from tfdp.util.logs import logger

# Shards prefetched per pipeline (a shard is a slice of a batch already in memory).
_PREFETCH = 2


def distribute(strategy, global_batches: tf.data.Dataset, replicas: int, dtype="float32"):
    """Per-replica ``(images, labels, example_weights)`` for ``model.fit``, images and weights
    in ``dtype``; ``global_batches`` yields ``(uint8 images, int64 labels)`` global batches."""
    def to_model_input(images, labels, weights):
        return to_float(images, dtype), labels, tf.cast(weights, dtype)

    if strategy is tf.distribute.get_strategy():  # No strategy: Keras' default one.
        return per_replica_batches(global_batches, 1, 0, 1).map(to_model_input).repeat()

    def dataset_fn(context):
        # Cut first, then convert: each pipeline turns only its own shards into floats.
        return per_replica_batches(
            global_batches, replicas,
            first=context.input_pipeline_id * (replicas // context.num_input_pipelines),
            count=replicas // context.num_input_pipelines
        ).map(to_model_input).repeat()

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return _multi_worker(strategy, dataset_fn)
    return strategy.distribute_datasets_from_function(dataset_fn, _options(per_replica=True))


def per_replica_batches(global_batches: tf.data.Dataset, num_replicas: int, first: int,
                        count: int) -> tf.data.Dataset:
    """Replicas ``first .. first+count-1``'s shards of each global batch, one element each.

    Elements are ``(images, labels, example_weights)``: every example weighs 1 / global batch
    (float64), so that a replica's weighted loss sum is its share of the global mean, however
    the batch was cut. ``tf.distribute`` hands consecutive elements to consecutive local
    replicas.
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


def _options(per_replica: bool):
    return tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=(tf.distribute.InputReplicationMode.PER_REPLICA
                                       if per_replica else
                                       tf.distribute.InputReplicationMode.PER_WORKER))


def _multi_worker(strategy, dataset_fn):
    if len(strategy.extended.worker_devices) != 1:
        return strategy.distribute_datasets_from_function(dataset_fn, _options(False))
    try:
        from tensorflow.python.distribute import device_util, input_lib, input_util
        extended = strategy.extended
        host = device_util.get_host_for_device(extended._worker_device)
        return input_util.get_distributed_datasets_from_function(
            dataset_fn=dataset_fn,
            input_workers=input_lib.InputWorkers([(host, (host,))]),
            input_contexts=[extended._make_input_context()],
            strategy=strategy, options=_options(True))
    except (ImportError, AttributeError, TypeError) as e:
        logger.warning("per-replica input under MultiWorkerMirroredStrategy unavailable (%s); "
                       "using the slower per-worker MultiDeviceIterator", e)
        return strategy.distribute_datasets_from_function(dataset_fn, _options(False))
