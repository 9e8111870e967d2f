"""Batch normalization whose moving statistics stay one value across replicas.

Keras 3 creates ``moving_mean`` and ``moving_variance`` with aggregation ``"none"``. Under
``MirroredStrategy`` and ``MultiWorkerMirroredStrategy`` a replica's update to such a variable
changes its own copy only (TensorFlow's ``_on_write_update_replica``), so every replica keeps
statistics of its own shards, and a read (``get_weights``, a backup, the export) returns replica
0's. The run's evaluation on several replicas then scores a mixture of models, none of them the
one exported: the symptom of tensorflow/tensorflow#46488 and keras-team/keras#14372 (closed
without a fix, from the Keras 2 days, when the statistics were ON_READ: per replica as well).

With aggregation ``"mean"`` each step's update is averaged across replicas instead: every
replica holds the same statistics, moved by the mean of the replicas' batch statistics (the
global batch's mean, for equal shards), and what is evaluated is what is exported.
``tests/test_keras_path.py`` fails once Keras' own layer keeps replicas equal.
"""

import keras

SHARED = ("moving_mean", "moving_variance")


class ReplicatedBatchNormalization(keras.layers.BatchNormalization):
    def add_weight(self, *args, **kwargs):
        if kwargs.get("name") in SHARED:
            kwargs["aggregation"] = "mean"
        return super().add_weight(*args, **kwargs)
