"""``python -m tfdp.server``: one worker of a cluster whose client runs ``tfdp.train``.

The from-scratch path across machines (``--strategy=manual`` with a ``TF_CONFIG`` naming
workers) places its replicas on the workers' devices by name, and TensorFlow's distributed
runtime runs each device's part of the step where the device is. A worker is therefore only a
TensorFlow server: this module prepares the data where the worker is (the client's steps read
each device's shard here, ``tfdp.paths.manual.remote``), starts the server with ``--num_gpus``
devices, and serves until the client, seen once, has gone, or until it is stopped.

``TF_CONFIG`` follows ``ParameterServerStrategy``'s conventions: the process running
``tfdp.train`` is the ``chief``, the servers are the ``worker``s, and, for
``--strategy=parameter_server``, the ``ps`` tasks (parameter servers: they hold variables, and
prepare no data)::

  TF_CONFIG='{"cluster": {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"]},
              "task": {"type": "worker", "index": 0}}' python -m tfdp.server --num_gpus=2

TensorFlow's gRPC servers have no authentication: anyone who reaches the port can run any
operation as this process's user. Run them on a trusted network only.
"""

import signal
import sys

from absl import app, flags

from tfdp.cluster import tf_config
from tfdp.cluster.tf_server import JOBS, Stopped, serve
from tfdp.config.flags import help_parser
from tfdp.util import logs
from tfdp.util.errors import UserError

flags.DEFINE_integer("num_gpus", 1, "Devices this worker serves (as tfdp.train's --num_gpus: "
                     "logical devices where there are fewer).")
flags.DEFINE_string("dataset", "fashion_mnist", "The data to prepare where this worker is (as "
                    "tfdp.train's --dataset: a TFDS name, folder:ROOT or npz:FILE).")
flags.DEFINE_string("image_size", None, "As tfdp.train's --image_size.")
flags.DEFINE_float("validation_split", None, "As tfdp.train's --validation_split.")
flags.DEFINE_integer("seed", 0, "As tfdp.train's --seed (which examples --validation_split "
                     "holds out).")
flags.DEFINE_string("data_dir", None, "tensorflow-datasets data dir; give every machine the "
                    "client's (default: TFDS's own).")
flags.DEFINE_string("manual_dir", None, "Folder with the four Fashion-MNIST .gz files, to "
                    "prepare the data from (as tfdp.train's --manual_dir).")
flags.DEFINE_boolean("data", True, "Prepare the data where this worker is, for tfdp.train; "
                     "--nodata serves devices only (the allreduce benchmark across hosts).")
flags.DEFINE_integer("collective_timeout", 60, "Seconds start-up waits for every name of "
                     "TF_CONFIG to resolve before failing in one line (a peer's name may appear "
                     "late, as a Kubernetes pod's does); tfdp.launch and a cluster manager pass "
                     "tfdp.train's when it is given.")
flags.DEFINE_boolean("verbose", False, "Also print TensorFlow's INFO lines.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        sys.exit(f"tfdp.server: error: unexpected arguments {argv[1:]}; flags look like "
                 "--name=value")
    # Stopped before serving: a normal end for a server (serving, see tf_server.serve).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        logs.configure(FLAGS.verbose)
        task = tf_config.task(kinds=JOBS, program="tfdp.server")
        if FLAGS.collective_timeout < 1:
            raise UserError(f"--collective_timeout must be a positive integer, got "
                            f"{FLAGS.collective_timeout}")
        data = (dict(dataset=FLAGS.dataset, data_dir=FLAGS.data_dir, manual_dir=FLAGS.manual_dir,
                     image_size=FLAGS.image_size, validation_split=FLAGS.validation_split,
                     seed=FLAGS.seed) if FLAGS.data else None)
        chief = serve(task, FLAGS.num_gpus, data, FLAGS.collective_timeout)
    except UserError as e:
        sys.exit(f"tfdp.server: error: {e}")
    except Stopped as e:
        print(f"tfdp.server: {e}", flush=True)
        sys.exit(e.code)
    except KeyboardInterrupt:
        sys.exit(130)
    print(f"tfdp.server: the chief at {chief} has finished; stopping", flush=True)


def run():
    app.run(main, flags_parser=help_parser("tfdp.server", __doc__))


if __name__ == "__main__":
    run()
