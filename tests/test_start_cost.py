"""What every TensorFlow process pays before it trains, where an upstream release made it
dearer and setup.cfg bounds that release out. Each test measures the installed package in a
fresh interpreter: when one passes with the bound lifted, the bound can go."""

import subprocess
import sys

# CPU-seconds of the main thread (the one that imports), in a fresh interpreter.
IMPORT_COST = """
import time
import numpy
start = time.thread_time()
import ml_dtypes
print(time.thread_time() - start)
"""


def test_ml_dtypes_imports_in_a_small_part_of_a_second():
    """ml_dtypes 0.7.0 took 0.58 CPU-seconds to import (0.01 for 0.6.0), in NumPy's
    PyUFunc_AddLoop comparing each new loop with those registered before it: 0.7 registers
    enough loops for that search to matter."""
    result = subprocess.run([sys.executable, "-c", IMPORT_COST], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert float(result.stdout) < 0.15, (
        f"importing ml_dtypes took {float(result.stdout):.2f} CPU-seconds")
