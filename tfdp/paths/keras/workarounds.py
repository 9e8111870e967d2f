"""Workarounds: Keras 3 ``fit`` under ``tf.distribute`` strategies (TF backend).

Upstream: https://github.com/keras-team/keras/issues/20585 and
https://github.com/tensorflow/tensorflow/issues/72388. In ``keras/src/backend/tensorflow/
trainer.py`` (seen in Keras 3.15):

1. ``_maybe_symbolic_build`` builds the model from ``strategy.reduce("MEAN", <first batch>,
   axis=None)``: an ``add_n`` of every replica's batch. That fails whenever the replicas'
   shards differ in size ("Inputs to operation AddN ... must have the same size and shape":
   MirroredStrategy on 3 devices with a global batch of 256 cuts 86 + 85 + 85), and under MWMS
   TF's ``Strategy.reduce`` takes no nested values at all ("Attempt to convert a value
   (PerReplica...)"). Building needs shapes only, so we build from this worker's first local
   replica's batch, under every strategy.
2. ``reduce_per_replica(..., "auto")`` turns into ``strategy.reduce("MEAN", scalar, axis=0)``
   ("Invalid reduction dimension 0 for input with 0 dimensions"). We reduce "auto"/"mean" to
   the mean over all replicas of all workers, so reported metrics stay global, with one batched
   collective for all of a step's logs.

``apply()`` is idempotent. Tests run fit without it (``tests/test_multi_worker.py``: two real
workers; ``tests/test_keras_path.py``: mirrored on 3 devices) and fail loudly once the installed
Keras no longer needs it.
"""

import os

import tensorflow as tf

DISABLE_ENV = "TFDP_DISABLE_KERAS_MWMS_FIX"  # For the test that checks it is still needed.
_applied = False


def apply() -> bool:
    """Patch Keras' TF trainer in place; return whether the patch is active."""
    global _applied
    if _applied or os.environ.get(DISABLE_ENV):
        return _applied
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    original_reduce = trainer.reduce_per_replica
    original_build = trainer.TensorFlowTrainer._maybe_symbolic_build

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            # One batched collective for all the step's logs, not one each: a cross-process
            # collective costs milliseconds (docs/benchmarks.md, "What bounds multi_worker").
            flat = tree.flatten(values)
            reduced = strategy.extended.batch_reduce_to(
                tf.distribute.ReduceOp.MEAN, [(v, v) for v in flat])
            return tree.pack_sequence_as(
                values, [strategy.experimental_local_results(r)[0] for r in reduced])
        return original_reduce(values, strategy, reduction)

    def maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or strategy is None:
            return original_build(self, iterator=iterator, data_batch=data_batch)
        for _, _, it in iterator:
            batch = tree.map_structure(
                lambda v: (strategy.experimental_local_results(v)[0]
                           if isinstance(v, tf.distribute.DistributedValues) else v),
                next(it))
            break
        with strategy.scope():
            self._symbolic_build(data_batch=batch)

    # _make_function looks the module-level name up when it traces, so patching it is enough.
    trainer.reduce_per_replica = reduce_per_replica
    trainer.TensorFlowTrainer._maybe_symbolic_build = maybe_symbolic_build
    _applied = True
    return True
