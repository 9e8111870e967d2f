"""``python -m tfdp.export <version> --formats=onnx,litert``: add the other formats to a SavedModel
version that tfdp exported before (``saved_models/lenet/1``), inside that folder, each file
written through a temporary name (``tfdp.export.formats``)::

  python -m tfdp.export saved_models/lenet/1 --formats=onnx,litert

A new run writes them itself with ``--export_formats``.
"""

import os
import sys

from absl import app, flags

from tfdp.config.flags import help_parser
from tfdp.export import formats as export_formats
from tfdp.util import logs
from tfdp.util.errors import UserError

flags.DEFINE_string("formats", "onnx,litert", "Formats to add: onnx, litert (comma-separated).")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) != 2:
        sys.exit("tfdp.export: error: give one exported version, e.g. python -m tfdp.export "
                 "saved_models/lenet/1 --formats=onnx,litert")
    version = argv[1]
    try:
        wanted = export_formats.parse(FLAGS.formats, "--formats")
        if not os.path.isfile(os.path.join(version, "saved_model.pb")):
            raise UserError(f"{version} holds no saved_model.pb: give a version folder that "
                            "tfdp.train exported")
        logs.configure(False)
        logs.import_tensorflow()  # Its start-up banners hidden.
        for path in export_formats.convert(version, wanted):
            print(f"tfdp.export: wrote {path}", flush=True)
    except UserError as e:
        sys.exit(f"tfdp.export: error: {e}")


def run():
    app.run(main, flags_parser=help_parser("tfdp.export", __doc__))


if __name__ == "__main__":
    run()
