"""A TFDS image-classification dataset by name, prepared once per data dir, offline-capable,
and written into tfdp's array cache (``tfdp.data.sources``).

``prepare``: TFDS prepares the dataset in ``data_dir`` once, under a file lock so workers
starting together do not collide: Fashion-MNIST from its four original files when they are
found (``tfdp.data.fashion_mnist``; no download is tried), any other from ``--manual_dir`` where its
TFDS builder takes one, else by downloading, after a quick check that the server answers.
``write_arrays`` reads its train and test splits as (image, label) pairs into the cache.
"""

import contextlib
import errno
import logging
import os
import re
import shutil
import socket
import threading
import urllib.parse
from typing import Optional

import numpy as np

from tfdp.data import array_cache
from tfdp.data import fashion_mnist
from tfdp.util import files
from tfdp.util import logs
from tfdp.util.errors import UserError
from tfdp.util.logs import logger

_BATCH = 4096


def prepare(name: str, data_dir: Optional[str], manual_dir: Optional[str]):
    """Return the TFDS builder of ``name``, preparing it in ``data_dir`` first if needed."""
    import tensorflow_datasets as tfds  # Heavy import, only where the data is read.

    with logs.quiet_below(logging.ERROR, "absl"):  # See _prepare_once.
        return _prepare_once(tfds, name, data_dir, manual_dir)


def cache_name(what: str, spec: str) -> str:
    """Named as given (its config and version too): no TFDS call to find it."""
    return "tfds-" + re.sub(r"[^\w.-]", "_", what)


def fingerprint(what: str):
    return None  # A prepared TFDS dataset does not change.


def fill(what: str, spec: str, folder: str, size, data_dir, manual_dir) -> dict:
    from tfdp.data.image_folder import fit

    return write_arrays(what, data_dir, manual_dir, folder, size, fit)


def write_arrays(name: str, data_dir, manual_dir, folder: str, size, fit) -> dict:
    """Both splits of the prepared ``name`` into the cache ``folder``, in batches (a dataset
    larger than memory is written as it is read); images resized by ``fit`` to ``size`` where
    given or where TFDS' images have no one size. The cache's info."""
    import tensorflow as tf
    import tensorflow_datasets as tfds
    from PIL import Image

    builder = prepare(name, data_dir, manual_dir)
    features = builder.info.features
    if builder.info.supervised_keys is None or "train" not in builder.info.splits \
            or "test" not in builder.info.splits:
        raise UserError(f"--dataset={name}: tfdp trains on (image, label) pairs with a train and "
                        f"a test split; TFDS' {name} has splits "
                        f"{', '.join(builder.info.splits)} and supervised keys "
                        f"{builder.info.supervised_keys}")
    image_key, label_key = builder.info.supervised_keys
    height, width, channels = features[image_key].shape
    if not size and (height is None or width is None):
        raise UserError(f"--dataset={name}: its images have no one size: give --image_size "
                        "(for example 64 or 64x48)")
    shape = (*(size or (height, width)), channels or 3)
    labels = features[label_key]
    counts = {split: builder.info.splits[split].num_examples for split in array_cache.SPLITS}
    for split in array_cache.SPLITS:
        arrays = array_cache.new_arrays(folder, split, counts[split], shape)
        examples = builder.as_dataset(split=split, as_supervised=True)
        # Images of one size come in batches; others one at a time, as batches of one.
        examples = (examples.batch(_BATCH) if height and width
                    else examples.map(lambda x, y: (x[tf.newaxis], y[tf.newaxis])))
        try:
            at = 0
            for images, classes in tfds.as_numpy(examples):
                if images.shape[1:] != shape:
                    images = np.stack([fit(Image.fromarray(image.squeeze(-1) if image.shape[-1]
                                                           == 1 else image), shape)
                                       for image in images])
                arrays.images[at:at + len(classes)] = images
                arrays.labels[at:at + len(classes)] = classes
                at += len(classes)
        except (tf.errors.OpError, ValueError) as e:
            raise damaged_preparation(name, builder.data_dir, e) from None
        if at != counts[split]:
            raise damaged_preparation(name, builder.data_dir, ValueError(
                f"{split} holds {at} examples, its description says {counts[split]}"))
        arrays.images.flush()
        arrays.labels.flush()
    return {"image_shape": list(shape), "num_classes": labels.num_classes,
            "class_names": list(labels.names), "examples": counts}


def damaged_preparation(name: str, folder: str, error: Exception) -> UserError:
    """The error for a prepared dataset that cannot be read, naming what to delete."""
    text = re.sub(r"\{\{.*?\}\}\s*", "", str(getattr(error, "message", error)))  # TF's op name.
    reason = text.strip().splitlines()
    return UserError(f"the prepared {name} in {folder} is damaged ({type(error).__name__}: "
                     f"{reason[-1][:200] if reason else ''}): delete {folder} and run again to "
                     "prepare it anew")


def _builder(tfds, name, data_dir):
    """TFDS' builder, which reads the prepared dataset's description if there is one."""
    from google.protobuf import json_format

    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise UserError(f"--dataset={name}: TFDS has no dataset of that name (tfds.list_builders()"
                        " lists them)") from None
    except (json_format.Error, ValueError, OSError) as e:
        folder = os.path.join(data_dir or tfds.core.constants.DATA_DIR, name)
        raise damaged_preparation(name, folder, e) from None


def _prepare_once(tfds, name, data_dir, manual_dir):
    builder = _builder(tfds, name, data_dir)
    if builder.is_prepared():
        return builder
    try:
        os.makedirs(builder.data_dir_root, exist_ok=True)
        lock = files.locked(os.path.join(builder.data_dir_root, f".{name}.lock"))
    except OSError as e:
        raise UserError(f"{name} is not prepared in {builder.data_dir_root}, and it cannot be "
                        f"prepared there ({e.strerror or e}): give a --data_dir you can write "
                        "to, or one where it is prepared") from None
    try:
        builder = _builder(tfds, name, data_dir)
        if builder.is_prepared():  # Another worker prepared it while we waited.
            return builder
        manual = fashion_mnist.find_manual_dir(manual_dir) if name == fashion_mnist.DATASET \
            else manual_dir
        if manual:
            if name == fashion_mnist.DATASET:
                fashion_mnist.check_manual_dir(manual)
            logger.info("preparing %s in %s from %s (once per data dir)", name,
                        builder.data_dir_root, manual)
        else:
            _check_download_reachable(name, getattr(builder, "URL", None))
            logger.info("preparing %s in %s: downloading", name, builder.data_dir_root)
        if not logs.verbose():
            # tfdp's line above says what happens. TFDS would add a hundred lines of tqdm bars,
            # two lines on stdout, and (through absl, quietened by the caller) warnings that the
            # folder it is about to write has no dataset_info.json yet.
            tfds.disable_progress_bar()
        try:
            with logs.stdout_dropped_unless_verbose():
                builder.download_and_prepare(
                    download_config=tfds.download.DownloadConfig(manual_dir=manual))
        except Exception as e:  # TFDS raises many kinds; all mean "could not get the data".
            _remove_incomplete(builder)
            raise _not_prepared(name, builder.data_dir_root, manual, e) from None
    finally:
        files.unlock(os.path.join(builder.data_dir_root, f".{name}.lock"), lock)
    return builder


def _not_prepared(name: str, root: str, manual: Optional[str], error: Exception) -> UserError:
    """Why TFDS could not prepare the data, and the remedy that fits: room on the disk, the
    manual files, or --manual_dir where there is no internet."""
    text = str(getattr(error, "message", error))
    reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    if "No space left on device" in text or getattr(error, "errno", None) == errno.ENOSPC:
        needs = " (it needs about 100 MB)" if name == fashion_mnist.DATASET else ""
        return UserError(f"could not prepare {name} in {root}: no space left on the device; "
                         f"make room{needs} or give another --data_dir, and run again")
    if manual:
        return UserError(f"could not prepare {name} in {root} from --manual_dir={manual} "
                         f"({reason}): check that it holds {_manual_files(name)}, and that the "
                         "--data_dir is writable")
    return UserError(f"could not prepare {name} in {root} by downloading ({reason}); without "
                     f"internet {_offline_remedy(name)}")


def _manual_files(name: str) -> str:
    if name == fashion_mnist.DATASET:
        return "the four original Fashion-MNIST .gz files"
    return f"the files TFDS' {name} takes from a manual dir"


def _offline_remedy(name: str) -> str:
    if name == fashion_mnist.DATASET:
        return ("pass --manual_dir=<folder with the four Fashion-MNIST .gz files> (or set "
                "TFDP_MANUAL_DIR)")
    return (f"prepare it on a machine with internet (tfds build {name} --data_dir=DIR) and "
            "give that --data_dir, or give --manual_dir where TFDS' builder takes one")


def _remove_incomplete(builder) -> None:
    """What a failed preparation left: TFDS' ``*.incomplete*`` folders and files of the
    dataset's version (a finished preparation is renamed from one)."""
    folder = os.path.dirname(builder.data_dir)
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        if ".incomplete" in name:
            path = os.path.join(folder, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.remove(path)


_REACH_SECONDS = 5
# Where TFDS looks first for a dataset whose builder names no URL of its own.
_TFDS_FIRST_TRIES = "https://storage.googleapis.com"


def _check_download_reachable(name: str, url: Optional[str]) -> None:
    """Fail in seconds, not minutes, where the download cannot work: without internet TFDS
    retries its DNS look-ups for more than 150 s before giving up."""
    parsed = urllib.parse.urlparse(url or _TFDS_FIRST_TRIES)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    outcome = []

    def connect():
        try:
            socket.create_connection((parsed.hostname, port), timeout=_REACH_SECONDS).close()
            outcome.append(True)
        except OSError:
            pass

    probe = threading.Thread(target=connect, daemon=True)  # A DNS look-up has no timeout.
    probe.start()
    probe.join(_REACH_SECONDS)
    if not outcome:
        raise UserError(f"{name} is not prepared, no manual dir was found, and its download "
                        f"server did not answer within {_REACH_SECONDS} s: "
                        f"{_offline_remedy(name)}")
