"""The parameter-server path's training step driven step by step, on a cluster inside this
process (a worker and two parameter servers: TensorFlow's tutorial's in-process cluster), for
``tests/test_parameter_server.py``: ``python tests/ps_step_once.py`` prints, as JSON, how each
variable and the update counter moved when a step ran once, ran again (its worker lost after
pushing, the step retried), ran after its push had reached only some variables, and when the
next step ran. Run in a process of its own: connecting to a cluster changes TensorFlow's
context for good."""

import json
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdp.config.settings import Config  # noqa: E402
from tfdp.launcher.processes import free_ports  # noqa: E402
from tfdp.paths.parameter_server.step import make_train_step  # noqa: E402
from tfdp.paths.parameter_server.store import make_store  # noqa: E402


def main():
    worker, *servers = (f"localhost:{port}" for port in free_ports(3))
    spec = tf.train.ClusterSpec({"worker": [worker], "ps": servers})
    for job, count in (("worker", 1), ("ps", 2)):
        for index in range(count):
            tf.distribute.Server(spec, job_name=job, task_index=index, protocol="grpc",
                                 start=True)
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    config = Config(workdir="/nonexistent", strategy="parameter_server")
    dataset = types.SimpleNamespace(image_shape=(28, 28, 1), num_classes=10)
    store = make_store(config, strategy, len(servers), dataset)
    step = make_train_step(store, config)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, [64, 28, 28, 1], dtype=np.uint8)
    labels = rng.integers(0, 10, [64], dtype=np.int64)
    arrays = iter(coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.from_tensors((images, labels)).repeat()))
    batch, lr = tf.range(32, dtype=tf.int32), tf.constant(0.1)

    def run(number):
        """Step ``number``: which variables it moved, and the counter and staleness after."""
        before = [v.numpy() for v in store.trainable]
        result = coordinator.schedule(step, args=(arrays, batch, lr,
                                                  tf.constant(number, tf.int64))).fetch()
        moved = [bool(np.any(v.numpy() != b)) for v, b in zip(store.trainable, before)]
        return {"moved": moved, "updates": int(store.updates.numpy()),
                "staleness": int(result[2])}

    steps = {"first": run(1), "again": run(1)}
    # Step 2's push reached the even-numbered variables before its worker was lost.
    for marks in store.marks[:-1][::2]:
        marks.scatter_update(tf.IndexedSlices(tf.constant([2], tf.int64), tf.constant([2])))
    steps["partly pushed"] = run(2)
    steps["next"] = run(3)
    steps["a step MARKS later"] = run(1 + store.marks[0].shape[0])
    print(json.dumps({"servers": sorted({v.device for v in store.trainable}),
                      "marks beside": [m.device == v.device for m, v in
                                       zip(store.marks, (*store.trainable, store.updates))],
                      **steps}))


if __name__ == "__main__":
    main()
