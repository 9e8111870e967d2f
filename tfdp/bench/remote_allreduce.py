"""tfdp's allreduce algorithms across machines, timed from the client of a ``tfdp.server``
cluster (``tfdp.bench.host_allreduce`` starts it on an emulated host; ``TF_CONFIG`` names the workers).

Every worker holds its gradient in variables on its CPU, made there (nothing crosses the
network to create them): ``--pieces`` equal parameters (``PIECES``, 12, unless told: then
``sharded``, parameter i summed on worker i mod k, is balanced on 2, 3 and 4 workers, as the
textbook's arithmetic assumes; 1 makes the gradient one tensor). One call runs the
allreduce and, on every worker, sums what it received, returning one scalar per worker: the
client reads k numbers, and checks them (every worker must hold k times its own sum).

Around each (algorithm, size) it prints ``MARK`` and waits for a line on stdin, so that whoever
started it can read the hosts' byte counters between phases (``tfdp.bench.host_allreduce``). At the end
it prints one JSON line: ``[{"algorithm", "workers", "dtype", "pieces", "parameters", "bytes",
"seconds", "samples", "calls"}, ...]``. A size is the float32 gradient's bytes; in bfloat16
(``--dtypes``, tfdp.train's ``--allreduce_dtype=bf16``) the same parameters travel in half.
"""

import json
import os
import statistics

import tensorflow as tf
from absl import app, flags

from tfdp.bench.host_allreduce import PIECES
from tfdp.bench.timing_process import mark, timed
from tfdp.paths.manual.allreduce import ALLREDUCE

flags.DEFINE_list("sizes", ["4000000"], "Gradient sizes in bytes, as float32.")
flags.DEFINE_list("dtypes", ["float32"], "What the gradients travel and are summed in.")
flags.DEFINE_list("algorithms", list(ALLREDUCE), "tfdp algorithms to time.")
flags.DEFINE_integer("repeats", 5, "Timed calls per row, after one warm-up call.")
flags.DEFINE_integer("pieces", PIECES, "Equal parameters the gradient is cut into.", lower_bound=1)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    k = len(cluster["worker"])
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster), job_name="chief",
                                              task_index=0)
    devices = [f"/job:worker/replica:0/task:{w}/device:CPU:0" for w in range(k)]
    rows, pieces = [], FLAGS.pieces
    for size, dtype in ((int(s), tf.as_dtype(d)) for s in FLAGS.sizes for d in FLAGS.dtypes):
        per_piece = max(1, size // 4 // pieces)
        grads = []
        for d, device in enumerate(devices):
            with tf.device(device):
                grads.append([tf.Variable(tf.fill([per_piece], tf.constant(d + 1, dtype)),
                                          trainable=False) for _ in range(pieces)])
        # Every worker: the sum of all (exact in bfloat16 too: each element sums to k(k+1)/2).
        expected = per_piece * pieces * k * (k + 1) / 2
        for name in FLAGS.algorithms:
            step = _compiled(ALLREDUCE[name], devices, grads)
            mark(f"{name} {size} {dtype.name}")
            got = step()  # Trace, and the warm-up call.
            if any(abs(float(g) - expected) > 1e-4 * expected for g in got):
                raise SystemExit(f"{name}: wrong sums {[float(g) for g in got]}, expected "
                                 f"{expected}")
            samples = timed(lambda: [float(g) for g in step()], FLAGS.repeats)  # noqa: B023
            mark("end")
            rows.append({"algorithm": name, "workers": k, "dtype": dtype.name,
                         "pieces": pieces, "parameters": per_piece * pieces,
                         "bytes": per_piece * pieces * dtype.size,
                         "seconds": statistics.median(samples), "samples": samples,
                         "calls": 1 + FLAGS.repeats})
        del grads
    print(json.dumps(rows), flush=True)


def _compiled(allreduce, devices, grads):
    @tf.function
    def step():
        values = []
        for device, g in zip(devices, grads):
            # Read where the variable is: read_value() outside a device scope ends in an
            # identity placed on the caller's device, and every gradient would pass through
            # the client (measured: twice the traffic, through host k).
            with tf.device(device):
                values.append([v.read_value() for v in g])
        out = allreduce(values, devices)
        sums = []
        for device, received in zip(devices, out):
            with tf.device(device):
                sums.append(tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in received]))
        return sums

    return step


if __name__ == "__main__":
    app.run(main)
