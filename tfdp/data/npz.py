"""``--dataset=npz:FILE``: an .npz file in the form of Keras' ``mnist.npz`` (``x_train``,
``y_train``, ``x_test``, ``y_test``, optionally ``class_names``), checked and written into the
array cache as arrays given to ``tfdp.run`` are (``tfdp.data.arrays``).
"""

import numpy as np

from tfdp.config import dataset_spec
from tfdp.data import array_cache
from tfdp.data.arrays import KEYS, checked, write
from tfdp.util.errors import UserError


def cache_name(what: str, spec: str) -> str:
    return array_cache.named_by_path("npz", what, dataset_spec.name_of(spec))


def fingerprint(what: str) -> str:
    return array_cache.fingerprint(what)


def fill(what: str, spec: str, folder: str, size, data_dir, manual_dir) -> dict:
    return write(read_npz(what), folder, size, spec)


def read_npz(path: str) -> dict:
    spec = f"npz:{path}"
    try:
        with np.load(path, allow_pickle=False) as f:
            names = list(f.files)
            arrays = {k: f[k] for k in (*KEYS, "class_names") if k in names}
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"--dataset={spec}: not an .npz file numpy can read ({type(e).__name__}: "
                        f"{str(e)[:120]})") from None
    missing = [k for k in KEYS if k not in names]
    if missing:  # Checked after reading: UserError is a ValueError, which the reading catches.
        raise UserError(f"--dataset={spec}: the file lacks {', '.join(missing)} (it needs "
                        f"{', '.join(KEYS)}, as Keras' mnist.npz; it holds "
                        f"{', '.join(names) or 'nothing'})")
    return checked(arrays, f"--dataset={spec}")
