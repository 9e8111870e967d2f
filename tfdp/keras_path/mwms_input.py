"""Per-replica input under MultiWorkerMirroredStrategy: each worker's replica reads its own
``tf.data`` iterator instead of a ``MultiDeviceIterator``.

TF accepts ``InputReplicationMode.PER_REPLICA`` only in MirroredStrategy's
``distribute_datasets_from_function``; MultiWorkerMirroredStrategy raises NotImplementedError
(``collective_all_reduce_strategy.py``), although the rest of its implementation is the same
call to ``input_util.get_distributed_datasets_from_function``. We make that call ourselves, as
MirroredStrategy does, when each worker has exactly one replica (every CPU worker). With more
devices per worker, or if TF's internals have moved, we fall back to the public PER_WORKER
input.

Why: the MultiDeviceIterator costs about 27 ms a step here (mirrored on 2 devices, 3,070-3,170
against 4,430-4,760 examples/s), and under MultiWorkerMirroredStrategy its per-device
datasets autotune, so dropping it at the end of ``fit`` waits seconds (evaluation.py). With
2 local workers, 60-step epochs, a worker's step went from 85 ms to 54-77 ms.
``tests/test_multi_worker.py`` checks that TF still refuses the public way.
"""

import tensorflow as tf

from tfdp.logs import logger


def distribute(strategy, dataset_fn):
    """``strategy.distribute_datasets_from_function(dataset_fn)`` with per-replica iterators."""
    public = tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_WORKER)
    if len(strategy.extended.worker_devices) != 1:
        return strategy.distribute_datasets_from_function(dataset_fn, public)
    try:
        from tensorflow.python.distribute import device_util, input_lib, input_util
        extended = strategy.extended
        host = device_util.get_host_for_device(extended._worker_device)
        return input_util.get_distributed_datasets_from_function(
            dataset_fn=dataset_fn,
            input_workers=input_lib.InputWorkers([(host, (host,))]),
            input_contexts=[extended._make_input_context()],
            strategy=strategy,
            options=tf.distribute.InputOptions(
                experimental_fetch_to_device=False,
                experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA))
    except (ImportError, AttributeError, TypeError) as e:
        logger.warning("per-replica input under MultiWorkerMirroredStrategy unavailable (%s); "
                       "using the slower per-worker MultiDeviceIterator", e)
        return strategy.distribute_datasets_from_function(dataset_fn, public)
