"""``python -m tfdp.predict EXPORT PATH...``: classify your images with a model tfdp exported.

EXPORT is an export folder (its newest version is used) or one version (``saved_models/lenet/3``).
Each PATH is an image file (PNG, JPEG, BMP, GIF), a folder (every image below it, in sorted
order, names starting with a dot skipped) or an .npz file (its ``x_test``, else ``x``, else its
only array: N x H x W or N x H x W x C uint8 images). Every image is fitted to the export's
input as the training fitted its data (``tfdp.data.image_folder.fit``: converted to its
channels, scaled keeping its aspect ratio, padded with black), and each batch is one call of
the export's ``serving_default``. Out: each image's top classes by name with their
probabilities, as a table, or as CSV or JSON (``--format``); a file that cannot be read is one
line on standard error, the others go on (exit 1 then). From Python::

  from tfdp.predict import predict
  for p in predict("saved_models/lenet", ["photos/"]):
      print(p.name, p.classes[0], p.probabilities[0])
"""

import csv
import io
import json
import os
import sys
import time
from typing import NamedTuple, Optional

import numpy as np
from absl import app, flags

from tfdp.config.flags import help_parser
from tfdp.data.image_folder import IMAGE_EXTENSIONS, fit
from tfdp.export.served import Exported, newest_version
from tfdp.util import logs
from tfdp.util.errors import UserError

flags.DEFINE_integer("top", 3, "Classes to give for each image, most probable first.")
flags.DEFINE_enum("format", "table", ["table", "csv", "json"], "table (for a terminal), csv or "
                  "json (a list with one object per image) on standard output.")
flags.DEFINE_integer("batch_size", 64, "Images per call of the exported model.")
FLAGS = flags.FLAGS

_PROGRESS_S = 1.0


class Prediction(NamedTuple):
    """One image's classes, most probable first (``error``: why it could not be read; then no
    classes)."""
    name: str                # the file, or FILE.npz[i]
    classes: tuple           # class names
    probabilities: tuple     # of those classes
    error: Optional[str] = None


def predict(export: str, paths, top: int = 3, batch_size: int = 64,
            progress=None) -> list:
    """A ``Prediction`` of every image ``paths`` name, in order, by the model exported under
    ``export``; ``progress(done, total)`` is called as batches finish."""
    model = Exported(export)
    top = max(1, min(top, len(model.class_names)))
    found = [item for path in ([paths] if isinstance(paths, str) else paths)
             for item in images_in(path)]
    predictions, batch = [], []
    if progress:
        progress(0, len(found))  # The export is loaded: predicting starts.

    def flush():
        if batch:
            probabilities = model.probabilities(np.stack([image for _, image in batch]))
            for (name, _), p in zip(batch, probabilities):
                best = np.argsort(-p, kind="stable")[:top]
                predictions.append(Prediction(name, tuple(model.class_names[k] for k in best),
                                              tuple(float(p[k]) for k in best)))
            batch.clear()
        if progress:  # Also after a damaged file: the last one may be.
            progress(len(predictions), len(found))

    for name, read in found:
        try:
            batch.append((name, read(model.shape)))
        except UserError as e:
            flush()  # In order: the images before it first.
            predictions.append(Prediction(name, (), (), str(e)))
            continue
        if len(batch) == batch_size:
            flush()
    flush()
    return predictions


def images_in(path: str) -> list:
    """[(name, read)] for every image ``path`` names; ``read(shape)`` gives it fitted to
    ``shape`` (H, W, C) as uint8, or raises ``UserError`` saying why not."""
    if os.path.isdir(path):
        found = []
        for top, folders, names in os.walk(path):
            folders[:] = sorted(f for f in folders if not f.startswith("."))
            found += [_file(os.path.join(top, name)) for name in sorted(names)
                      if not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)]
        return found
    if path.lower().endswith(".npz"):
        return _arrays(path)
    return [_file(path)]


def _file(path: str) -> tuple:
    def read(shape):
        from PIL import Image

        try:
            with Image.open(path) as image:
                return fit(image, shape)
        except Exception as e:  # PIL raises many kinds; all mean "not an image".
            raise UserError(f"not an image PIL can read ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:120] if str(e) else ''})") from None
    return path, read


def _arrays(path: str) -> list:
    try:
        with np.load(path, allow_pickle=False) as data:
            key = next((k for k in ("x_test", "x") if k in data.files),
                       data.files[0] if len(data.files) == 1 else None)
            images = data[key] if key else None
    except (OSError, ValueError) as e:
        return [(path, _refused(f"not an .npz file numpy can read ({e})"))]
    if images is None:
        return [(path, _refused(f"holds {', '.join(data.files)}: give one array, or x_test or "
                                "x"))]
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        return [(path, _refused(f"its {key} is {images.dtype} {images.shape}: give uint8 "
                                "images N x H x W or N x H x W x C"))]

    def reader(image):
        def read(shape):
            from PIL import Image

            if image.shape == shape:
                return image
            return fit(Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[-1] == 1
                                       else image), shape)
        return read

    return [(f"{path}[{i}]", reader(image)) for i, image in enumerate(images)]


def _refused(why: str):
    def read(shape):
        raise UserError(why)
    return read


def formatted(predictions: list, how: str) -> str:
    """``predictions`` (those read) as a table, CSV or JSON."""
    if how == "json":
        return json.dumps([{"image": p.name, "top": [
            {"class": c, "probability": round(q, 6)} for c, q in zip(p.classes, p.probabilities)]}
            for p in predictions], indent=1) + "\n"
    top = max((len(p.classes) for p in predictions), default=0)
    if how == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["image"] + [f"{part}_{k + 1}" for k in range(top)
                                     for part in ("class", "probability")])
        writer.writerows([p.name] + [x for c, q in zip(p.classes, p.probabilities)
                                     for x in (c, f"{q:.6f}")] for p in predictions)
        return out.getvalue()
    header = ["image"] + [f"#{k + 1}" for k in range(top)]
    cells = [[p.name] + [f"{c} {q:.1%}" for c, q in zip(p.classes, p.probabilities)]
             for p in predictions]
    widths = [max(len(row[k]) for row in [header] + cells if k < len(row))
              for k in range(len(header))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n"
                   for row in [header] + cells)


class _Progress:
    """``predicting: 640 of 5000 images`` redrawn on standard error in a terminal, at most
    once a second; the last line gives the rate (images read, fitted and classified a second,
    from when the export was loaded)."""

    def __init__(self):
        self.shown, self.live, self.started = 0.0, sys.stderr.isatty(), None

    def __call__(self, done: int, total: int):
        if self.started is None:
            self.started = time.monotonic()
        if self.live and (time.monotonic() - self.shown >= _PROGRESS_S or done == total):
            self.shown = time.monotonic()
            seconds = self.shown - self.started
            rate = (f" in {seconds:.1f} s ({done / seconds:,.0f} images/s)\n"
                    if done == total and seconds > 0 else "\n" if done == total else "")
            sys.stderr.write(f"\rpredicting: {done} of {total} images{rate}")
            sys.stderr.flush()


def main(argv):
    if len(argv) < 3:
        sys.exit("tfdp.predict: error: give an export and one or more images, folders or .npz "
                 "files, e.g. python -m tfdp.predict saved_models/lenet photos/")
    try:
        for path in argv[2:]:
            if not os.path.exists(path):
                raise UserError(f"there is no file or folder {path}")
        if FLAGS.top < 1 or FLAGS.batch_size < 1:
            raise UserError("--top and --batch_size must be positive integers")
        version = newest_version(argv[1])  # Before TensorFlow starts: a mistake is quick.
        logs.configure(False)
        logs.import_tensorflow()  # Its start-up banners hidden.
        predictions = predict(version, argv[2:], FLAGS.top, FLAGS.batch_size, _Progress())
    except UserError as e:
        sys.exit(f"tfdp.predict: error: {e}")
    failed = [p for p in predictions if p.error]
    for p in failed:
        print(f"tfdp.predict: skipped {p.name}: {p.error}", file=sys.stderr)
    if not failed or len(failed) < len(predictions):
        sys.stdout.write(formatted([p for p in predictions if not p.error], FLAGS.format))
    sys.exit(1 if failed else 0)


def run():
    app.run(main, flags_parser=help_parser("tfdp.predict", __doc__))


if __name__ == "__main__":
    run()
