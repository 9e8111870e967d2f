"""Fashion-MNIST, tfdp's default dataset: its four original files and their checksums.

``find_manual_dir``: where the four original .gz files are (flag, $TFDP_MANUAL_DIR, or the
shared folder beside this checkout), checked against the release checksums, from which
``tfdp.data.tfds`` has TFDS prepare the dataset (as it prepares any TFDS dataset).
"""

import hashlib
import os
from typing import Optional

from tfdp.util.errors import UserError

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
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
