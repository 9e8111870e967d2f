"""Allreduce micro-benchmark, run in a process of its own (it needs 4 logical CPU devices).

For gradient sizes from a few KB to 64 MB and k = 2..4 devices: time per allreduce of tfdp's
``add_n``, ``sharded`` and ``ring`` and of tf.distribute's cross-device ops, and the bus
bandwidth, size x 2(k-1)/k / time (the NCCL convention: what each link carries), against
the machine's memcpy bandwidth. Prints one JSON document; ``tfdp.bench`` formats it.

  python -m tfdp.bench.allreduce --sizes=4096,262144 --ks=2,3,4 --repeats=5
"""

import json
import time

import numpy as np
import tensorflow as tf
from absl import app, flags

from tfdp.paths.manual.allreduce import ALLREDUCE
from tfdp.util import devices

SIZES = (4 << 10, 256 << 10, 4 << 20, 64 << 20)  # bytes of float32 gradients
flags.DEFINE_list("sizes", [str(s) for s in SIZES], "Gradient sizes in bytes.")
flags.DEFINE_list("ks", ["2", "3", "4"], "Device counts.")
flags.DEFINE_integer("repeats", 5, "Timed repeats per row (the best counts).")
FLAGS = flags.FLAGS
DISTRIBUTE_OPS = {
    "ReductionToOneDevice": tf.distribute.ReductionToOneDevice,
    "HierarchicalCopyAllReduce": tf.distribute.HierarchicalCopyAllReduce,
}


def best_time(fn, repeats):
    fn()  # Trace and warm up.
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def memcpy_gbps(nbytes=64 << 20):
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    return nbytes / best_time(lambda: np.copyto(dst, src), 5) / 1e9


def tfdp_allreduce(name, names, tensors):
    fn = tf.function(lambda *ts: ALLREDUCE[name]([[t] for t in ts], names))
    return lambda: [o[0].numpy() for o in fn(*tensors)][0]


def distribute_allreduce(ops_class, names, tensors):
    strategy = tf.distribute.MirroredStrategy(
        names, cross_device_ops=ops_class() if ops_class else None)
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tensors[context.replica_id_in_sync_group])

    @tf.function
    def reduce():
        return strategy.extended.reduce_to(tf.distribute.ReduceOp.SUM, values, values)

    return lambda: strategy.experimental_local_results(reduce())[0].numpy()


def main(argv):
    del argv
    sizes, ks, repeats = [int(s) for s in FLAGS.sizes], [int(k) for k in FLAGS.ks], FLAGS.repeats
    names = devices.configure_devices(max(ks))
    rows = []
    for k in ks:
        for size in sizes:
            tensors = []
            for name in names[:k]:
                with tf.device(name):
                    tensors.append(tf.ones([size // 4]))
            candidates = {name: lambda n=name: tfdp_allreduce(n, names[:k], tensors)
                          for name in ALLREDUCE}
            candidates.update({name: lambda c=cls: distribute_allreduce(c, names[:k], tensors)
                               for name, cls in DISTRIBUTE_OPS.items()})
            # MirroredStrategy's own choice on CPUs: CollectiveAllReduce (RING).
            candidates["CollectiveAllReduce"] = lambda: distribute_allreduce(None, names[:k],
                                                                             tensors)
            for name, make in candidates.items():
                try:
                    seconds = best_time(make(), repeats)
                except Exception as e:  # Some tf.distribute ops refuse CPU devices.
                    rows.append({"algorithm": name, "k": k, "bytes": size, "error":
                                 f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"})
                    continue
                rows.append({"algorithm": name, "k": k, "bytes": size, "seconds": seconds,
                             "bus_gbps": size * 2 * (k - 1) / k / seconds / 1e9})
    print(json.dumps({"memcpy_gbps": memcpy_gbps(), "rows": rows}))


if __name__ == "__main__":
    app.run(main)
