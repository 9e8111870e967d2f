"""Fashion-MNIST through tensorflow-datasets, prepared once per data dir, offline-capable.

1. ``find_manual_dir``: where the four original .gz files are (flag, $TFDP_MANUAL_DIR, or the
   shared folder beside this checkout), checked against the release checksums.
2. ``prepare``: TFDS prepares the dataset in ``data_dir`` once, from those files when given (no
   download is tried), under a file lock so workers starting together do not collide. Without
   them, TFDS downloads, after a quick check that its server answers at all.
"""

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import socket
import threading
import urllib.parse
from typing import Optional

from tfdp import files
from tfdp import logs
from tfdp.errors import UserError
from tfdp.logs import logger

DATASET = "fashion_mnist"
# TFDS' names of the ten labels, in label order (tests/test_data.py reads them from TFDS).
LABEL_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot")
# The checksums TFDS registers for the fashion_mnist release files.
MANUAL_FILES = {
    "train-images-idx3-ubyte.gz": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
    "train-labels-idx1-ubyte.gz": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    "t10k-images-idx3-ubyte.gz": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    "t10k-labels-idx1-ubyte.gz": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
}
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SHARED_MANUAL_DIR = os.path.join(_REPO_ROOT, "..", "shared", "data", "fashion_mnist")


def find_manual_dir(manual_dir: Optional[str]) -> Optional[str]:
    """The folder to prepare from: the flag, else $TFDP_MANUAL_DIR, else the shared folder."""
    for candidate in (manual_dir, os.environ.get("TFDP_MANUAL_DIR"), _SHARED_MANUAL_DIR):
        if candidate and os.path.isdir(candidate):
            return os.path.abspath(candidate)
    return None


def check_manual_dir(manual_dir: str) -> None:
    """Refuse a manual dir with a missing or damaged file, naming the file."""
    for name, sha256 in MANUAL_FILES.items():
        path = os.path.join(manual_dir, name)
        if not os.path.isfile(path):
            raise UserError(f"{path} is missing: --manual_dir needs the four original "
                            f"Fashion-MNIST files ({', '.join(MANUAL_FILES)})")
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != sha256:
            raise UserError(f"{path} is damaged (sha256 {digest[:12]}..., expected "
                            f"{sha256[:12]}...): copy the original release file again")


def prepare(data_dir: Optional[str], manual_dir: Optional[str]):
    """Return the TFDS builder, preparing the dataset in ``data_dir`` first if needed."""
    import tensorflow_datasets as tfds  # Heavy import, only where the data is read.

    with logs.quiet_below(logging.ERROR, "absl"):  # See _prepare_once.
        return _prepare_once(tfds, data_dir, manual_dir)


def damaged_preparation(folder: str, error: Exception) -> UserError:
    """The error for a prepared dataset that cannot be read, naming what to delete."""
    text = re.sub(r"\{\{.*?\}\}\s*", "", str(getattr(error, "message", error)))  # TF's op name.
    reason = text.strip().splitlines()
    return UserError(f"the prepared {DATASET} in {folder} is damaged ({type(error).__name__}: "
                     f"{reason[-1][:200] if reason else ''}): delete {folder} and run again to "
                     "prepare it anew")


def _builder(tfds, data_dir):
    """TFDS' builder, which reads the prepared dataset's description if there is one."""
    from google.protobuf import json_format

    try:
        return tfds.builder(DATASET, data_dir=data_dir)
    except (json_format.Error, ValueError, OSError) as e:
        folder = os.path.join(data_dir or tfds.core.constants.DATA_DIR, DATASET)
        raise damaged_preparation(folder, e) from None


def _prepare_once(tfds, data_dir, manual_dir):
    builder = _builder(tfds, data_dir)
    if builder.is_prepared():
        return builder
    try:
        os.makedirs(builder.data_dir_root, exist_ok=True)
        lock = files.locked(os.path.join(builder.data_dir_root, f".{DATASET}.lock"))
    except OSError as e:
        raise UserError(f"{DATASET} is not prepared in {builder.data_dir_root}, and it cannot be "
                        f"prepared there ({e.strerror or e}): give a --data_dir you can write "
                        "to, or one where it is prepared") from None
    try:
        builder = _builder(tfds, data_dir)
        if builder.is_prepared():  # Another worker prepared it while we waited.
            return builder
        manual = find_manual_dir(manual_dir)
        if manual:
            check_manual_dir(manual)
            logger.info("preparing %s in %s from %s (once per data dir)", DATASET,
                        builder.data_dir_root, manual)
        else:
            _check_download_reachable(getattr(builder, "URL", None))
            logger.info("preparing %s in %s: downloading", DATASET, builder.data_dir_root)
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
            raise _not_prepared(builder.data_dir_root, manual, e) from None
    finally:
        files.unlock(os.path.join(builder.data_dir_root, f".{DATASET}.lock"), lock)
    return builder


def _not_prepared(root: str, manual: Optional[str], error: Exception) -> UserError:
    """Why TFDS could not prepare the data, and the remedy that fits: room on the disk, the
    manual files, or --manual_dir where there is no internet."""
    text = str(getattr(error, "message", error))
    reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    if "No space left on device" in text or getattr(error, "errno", None) == errno.ENOSPC:
        return UserError(f"could not prepare {DATASET} in {root}: no space left on the device; "
                         "make room (it needs about 100 MB) or give another --data_dir, and "
                         "run again")
    if manual:
        return UserError(f"could not prepare {DATASET} in {root} from --manual_dir={manual} "
                         f"({reason}): check that it holds the four original Fashion-MNIST "
                         ".gz files, and that the --data_dir is writable")
    return UserError(f"could not prepare {DATASET} in {root} by downloading ({reason}); without "
                     "internet pass --manual_dir=<folder with the four Fashion-MNIST .gz files>")


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


def _check_download_reachable(url: Optional[str]) -> None:
    """Fail in seconds, not minutes, where the download cannot work: without internet TFDS
    retries its DNS look-ups for more than 150 s before giving up."""
    if not url:
        return
    parsed = urllib.parse.urlparse(url)
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
        raise UserError(f"{DATASET} is not prepared, no manual dir was found, and its download "
                        f"server did not answer within {_REACH_SECONDS} s: pass "
                        "--manual_dir=<folder with the four Fashion-MNIST .gz files> (or set "
                        "TFDP_MANUAL_DIR)")
