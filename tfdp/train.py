"""``python -m tfdp.train``: train data-parallel, report each epoch, export a SavedModel.

  python -m tfdp.train --num_gpus=2                        # from scratch on 2 devices
  python -m tfdp.train --strategy=mirrored --num_gpus=2    # Keras fit, MirroredStrategy
  python -m tfdp.launch --num_workers=2 -- --strategy=multi_worker   # 2 local workers
  srun -N2 -n2 python -m tfdp.train --strategy=multi_worker --workdir=...   # under Slurm
"""

import sys

from tfdp.training import mid_step, preemption

if __name__ == "__main__":  # A signal while the modules below import waits for main.
    preemption.hold_until_main()

from absl import app  # noqa: E402

from tfdp.config import flags
from tfdp.util import logs  # noqa: E402
from tfdp.util.errors import (INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, Finished,  # noqa: E402
                              Interrupted, Preempted, UserError)
from tfdp.cluster import managed  # noqa: E402


def main(argv):
    if len(argv) > 1:
        sys.exit(f"tfdp.train: error: unexpected arguments {argv[1:]}; flags look like --name=value")
    train_from_flags(flags.FLAGS)


def train_from_flags(flag_values) -> None:
    """All that ``tfdp.train`` does once its command line is parsed into ``flag_values``
    (tests run it in their own process, with flag values of their own)."""
    try:
        with preemption.preempt_outside_runs():
            config = flags.config_from_flags(flag_values)
            logs.configure(config.verbose)
            # Under Slurm or Kubernetes: TF_CONFIG from the manager; a server task leaves here.
            managed.join(config)
            managed.check_task(config.strategy)  # Before TensorFlow, which takes seconds.
            logs.import_tensorflow()
            with mid_step.mid_step_signals("tfdp.train"):
                from tfdp.training import entry  # TensorFlow, after logs hid its start-up.

                entry.train(config)
    except Finished as e:
        print(f"tfdp.train: {e}", flush=True)
    except UserError as e:
        print(f"tfdp.train: error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    except Preempted as e:
        # After a terminal's "^C" echo, the line of its own.
        start = "\n" if e.by == "Ctrl-C" and sys.stderr.isatty() else ""
        print(f"{start}tfdp.train: {e}", file=sys.stderr, flush=True)
        sys.exit(PREEMPTED_EXIT_CODE)
    except KeyboardInterrupt as e:  # A second Ctrl-C (Interrupted), or one after the run.
        why = e if isinstance(e, Interrupted) else "interrupted (Ctrl-C): nothing to save"
        print(f"\ntfdp.train: {why}", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED_EXIT_CODE)


def run():
    flags.define_flags()
    app.run(main, flags_parser=flags.help_parser("tfdp.train", __doc__, [flags.__name__]))


if __name__ == "__main__":
    run()
