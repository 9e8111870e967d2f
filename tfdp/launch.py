"""``python -m tfdp.launch --num_workers=N -- <train flags>``: a local cluster on 127.0.0.1.

Moves itself into a private network namespace with loopback only (``tfdp.launcher.isolation``; the
workers inherit it, so their servers are unreachable from outside), picks ports, starts the
cluster's processes with their ``TF_CONFIG``, pins the workers to their shares of the CPU
cores, prefixes each process's output, and waits. What it starts depends on the strategy:

* ``--strategy=multi_worker``: N ``python -m tfdp.train`` workers, prefixed ``[i]``; only the
  chief (worker 0) prints the per-epoch report and the final line.
* ``--strategy=manual``: N ``python -m tfdp.server`` workers (``[i]``) and one ``python -m
  tfdp.train`` client, the chief (``[chief]``), which trains the from-scratch path on the
  workers' devices (``--num_gpus`` each; ``tfdp.paths.manual.remote``). The client's exit decides.
* ``--strategy=parameter_server``: N ``python -m tfdp.server`` workers (``[i]``), ``--num_ps``
  parameter servers (``tfdp.server`` too, ``[ps j]``) and the coordinator, the chief
  (``[chief]``; ``tfdp.paths.parameter_server.trainer``). The chief's exit decides; a worker that
  dies while it runs is started again (TensorFlow's coordinator retries its steps on the others
  meanwhile, and it rejoins), up to ``RESTARTS`` times.

Faults: if a worker fails, the others are stopped and the launcher exits with its code; with
``--max_restarts=N`` (multi_worker, and manual's servers and its client) the group re-forms
with it started again instead, and with ``--num_workers=MIN:MAX`` without it, while at least
MIN are left; SIGUSR1 to the launcher then takes a worker back in, up to MAX, from one common
step every worker (or manual's client) saves (``tfdp.launcher.elastic``). SIGTERM
or Ctrl-C to the launcher, or SIGTERM to any worker, is a preemption: every worker saves the
same step and exits with ``PREEMPTED_EXIT_CODE`` (75), and so does the launcher; the same command
resumes. A second Ctrl-C stops them at once (130). Workers die with the launcher whatever kills
it (``PR_SET_PDEATHSIG``).

With ``--hosts`` (Linux, root) every worker runs on an emulated host of its own instead,
with ``--link`` the rate of every host's link (``tfdp.launcher.emulated_hosts``).

In every task of a Slurm step (``srun --no-kill``) or every pod of a Kubernetes Indexed Job,
``tfdp.launch --num_workers=MIN:MAX`` is that task's agent instead: it runs the task's own
``multi_worker`` worker, and the agents keep the group going together, through the run folder,
when tasks are lost or come (``tfdp.launcher.managed_group``).

  python -m tfdp.launch --num_workers=2 -- --strategy=multi_worker --epochs=3
  python -m tfdp.launch --num_workers=2:3 -- --strategy=multi_worker --backup_every=100
  python -m tfdp.launch --num_workers=2 --max_restarts=3 -- --strategy=multi_worker
  python -m tfdp.launch --num_workers=1:2 -- --strategy=manual --backup_every=100
  python -m tfdp.launch --num_workers=3 --hosts --link=100mbit -- --strategy=multi_worker
  python -m tfdp.launch --num_workers=2 --hosts --link=1gbit -- --strategy=manual --allreduce=ring
  python -m tfdp.launch --num_workers=2 --num_ps=2 -- --strategy=parameter_server --ps_shards=2
  srun --no-kill -n3 python -m tfdp.launch --num_workers=2:3 -- --strategy=multi_worker \
      --backup_every=100 --workdir=/shared/run1
"""

import dataclasses
import sys

from absl import app, flags

from tfdp.cluster import managed
from tfdp.config.flags import help_parser
from tfdp.config.settings import Config
from tfdp.launcher.local_cluster import launch

flags.DEFINE_string("num_workers", "2", "Workers to start on this machine: tfdp.train processes "
                    "(multi_worker), or tfdp.server processes for one tfdp.train client (manual, "
                    "parameter_server). multi_worker and manual also take MIN:MAX: MAX start, "
                    "and when one is lost (killed, crashed) the group re-forms with the others "
                    "from the newest backup, at the same global batch, while at least MIN are "
                    "left; SIGUSR1 to the launcher takes one back in, up to MAX. In every task "
                    "of a Slurm step or pod of an Indexed Job: the group's size, each task one "
                    "worker, going on with at least MIN and taking tasks that come in, up to "
                    "MAX.")
flags.DEFINE_integer("max_restarts", 0, "multi_worker and manual: lost workers (and manual's "
                     "client, killed) to start again, in all, as the group re-forms from the "
                     "newest backup (a fixed --num_workers=N keeps N so); without restarts "
                     "left, MIN:MAX goes on with fewer.", lower_bound=0)
flags.DEFINE_integer("num_ps", None, "--strategy=parameter_server: parameter servers to start "
                     "(tfdp.server ps tasks; default 1).")
flags.DEFINE_boolean("isolate", True, "Run the workers in a private network namespace (loopback "
                     "only), so their unauthenticated TensorFlow servers are unreachable from "
                     "outside; --noisolate leaves them on every interface.")
flags.DEFINE_boolean("hosts", False, "Run every worker on an emulated host of its own: a network "
                     "namespace with its own address, joined to the others by a switch (Linux, "
                     "root). Everything made is removed on exit.")
flags.DEFINE_string("link", None, "With --hosts: every host's link rate, both directions, in tc "
                    "syntax (10mbit, 100mbit, 1gbit); default unshaped.")
FLAGS = flags.FLAGS
TRAIN_FLAGS = {field.name for field in dataclasses.fields(Config)}


def main(argv):
    sys.exit(launch(FLAGS.num_workers, argv[1:], isolate=FLAGS.isolate, hosts=FLAGS.hosts,
                    link=FLAGS.link, num_ps=FLAGS.num_ps, max_restarts=FLAGS.max_restarts,
                    managed_task=managed.described))


def run():
    # Everything after "--" goes to the workers untouched.
    app.run(main, flags_parser=help_parser("tfdp.launch", __doc__, parse=_parse))


def _parse(argv):
    if "--" in argv:
        split = argv.index("--")
        own, rest = argv[:split], argv[split + 1:]
    else:
        own, rest = argv, []
    try:
        return FLAGS(own) + rest
    except flags.UnrecognizedFlagError as e:
        if e.flagname in TRAIN_FLAGS:
            raise flags.Error(f"--{e.flagname} is a flag of tfdp.train: give the workers' flags "
                              "after --, as in python -m tfdp.launch --num_workers=2 -- "
                              f"--{e.flagname}=...") from None
        raise


if __name__ == "__main__":
    run()
