"""``python -m tfdp.train``: train data-parallel, report each epoch, export a SavedModel.

  python -m tfdp.train --num_gpus=2                        # from scratch on 2 devices
  python -m tfdp.train --strategy=mirrored --num_gpus=2    # Keras fit, MirroredStrategy
  python -m tfdp.launch --num_workers=2 -- --strategy=multi_worker   # 2 local workers
"""

import os
import sys

from absl import app

from tfdp import flags, logs
from tfdp.errors import UserError


def run_manual(config) -> dict:
    """The from-scratch path: devices, data, train, report, export."""
    from tfdp import data, devices, export, report
    from tfdp.manual import trainer

    names = devices.configure_devices(config.num_gpus)
    export.check_export_root(config.export_root)
    batch = config.global_batch_size(len(names))  # Refuses a batch too small, before any work.
    train_split, test_split = data.load_splits(config.data_dir, config.manual_dir,
                                               config.synthetic_data)
    reporter = report.Reporter(
        config.run_dir, report.run_facts(config, batch, len(names)), names,
        eval_examples=data.eval_examples(len(test_split.labels), batch, config.eval_steps),
        test_examples=len(test_split.labels))
    params = trainer.train(config, names, train_split, test_split, reporter)
    line = reporter.final_line()
    path = export.export(trainer.serving_model(params), config.export_root)
    reporter.record_export(path)
    print(f"exported {path}", flush=True)
    return {"final_line": line, "export_path": path, "records": reporter.records,
            "params": params}


def run_config(config) -> dict:
    """Dispatch one validated run to its path."""
    from tfdp.config import with_run_dir

    config = with_run_dir(config)
    if config.strategy == "manual":
        return run_manual(config)
    from tfdp.keras_path import trainer as keras_trainer

    return keras_trainer.run(config)


def main(argv):
    if len(argv) > 1:
        sys.exit(f"tfdp.train: error: unexpected arguments {argv[1:]}; flags look like --name=value")
    try:
        config = flags.config_from_flags()
        logs.configure(config.verbose)
        logs.import_tensorflow()
        run_config(config)
    except UserError as e:
        sys.exit(f"tfdp.train: error: {e}")


def parse_flags(argv):
    flags.define_flags()
    if any(arg in ("-h", "--help", "-help", "--helpshort") for arg in argv[1:]):
        # absl's --help lists the main module's flags only (tfdp's live in tfdp.flags) and
        # exits 1; --helpfull still shows absl's own too.
        try:
            print(__doc__.strip().replace("``", ""))
            print(flags.FLAGS.module_help(flags.__name__), flush=True)
        except BrokenPipeError:  # `--help | head`: the reader has all it wants.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    return app.parse_flags_with_usage(argv)


def run():
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
