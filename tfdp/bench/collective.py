"""TensorFlow's own cross-process all-reduce, timed on one worker of a cluster: the
``CollectiveAllReduce`` that ``MultiWorkerMirroredStrategy`` runs (its ring implementation,
as on CPUs). ``tfdp.bench.host_allreduce`` starts one per emulated host, with ``TF_CONFIG``.

Each worker all-reduces a tensor of each size (in float32 bytes) and dtype (one warm-up call,
then ``repeats`` timed calls; every call waits for every worker, so the calls line up), checks
the sum, and worker 0 marks each phase and prints one JSON line, as
``tfdp.bench.remote_allreduce`` does.
"""

import json
import statistics

import tensorflow as tf
from absl import app, flags

from tfdp.bench.timing_process import mark, timed
from tfdp.cluster import tf_config
from tfdp.util import logs

flags.DEFINE_list("sizes", ["4000000"], "Sizes in bytes, as float32.")
flags.DEFINE_list("dtypes", ["float32"], "What the tensors are summed in.")
flags.DEFINE_integer("repeats", 5, "Timed calls per size, after one warm-up call.")
FLAGS = flags.FLAGS

NAME = "tf_collective_ring"


def main(argv):
    del argv
    logs.configure(verbose=False)
    task = tf_config.task()
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    k = strategy.num_replicas_in_sync
    rows = []
    for size, dtype in ((int(s), tf.as_dtype(d)) for s in FLAGS.sizes for d in FLAGS.dtypes):
        n = max(1, size // 4)
        value = tf.fill([n], tf.constant(task.worker_index + 1, dtype))

        def replica(value):
            total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                                   value)
            # One number back, as for tfdp's algorithms.
            return tf.reduce_sum(tf.cast(total, tf.float32))

        @tf.function
        def reduce():
            return strategy.run(replica, args=(value,))  # noqa: B023 (traced right here)

        expected = n * k * (k + 1) / 2
        if task.is_chief:  # The others wait for it in the first all-reduce.
            mark(f"{NAME} {size} {dtype.name}")
        got = float(reduce())
        if abs(got - expected) > 1e-4 * expected:
            raise SystemExit(f"{NAME}: wrong sum {got}, expected {expected}")
        samples = timed(lambda: float(reduce()), FLAGS.repeats)  # noqa: B023
        if task.is_chief:
            mark("end")
        rows.append({"algorithm": NAME, "workers": k, "dtype": dtype.name, "parameters": n,
                     "bytes": n * dtype.size,
                     "seconds": statistics.median(samples), "samples": samples,
                     "calls": 1 + FLAGS.repeats})
    if task.is_chief:
        print(json.dumps(rows), flush=True)


if __name__ == "__main__":
    app.run(main)
