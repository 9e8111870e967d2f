"""The suite's own workers (tests/conftest.py): the tests of one ``xdist_group`` run on one
worker, which is what lets a real Slurm and the shared runs start once. pytest 9.2 broke that
silently (https://github.com/pytest-dev/pytest-xdist/issues/1386; setup.cfg bounds pytest
below it): this runs the installed pytest and pytest-xdist on two groups and asks where each
test ran. And a test that fails leaves no process of its own running on the worker."""

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

GROUPED = '''
import pytest

@pytest.mark.xdist_group("first")
@pytest.mark.parametrize("i", range(4))
def test_first(i):
    pass

@pytest.mark.xdist_group("second")
@pytest.mark.parametrize("i", range(4))
def test_second(i):
    pass
'''


def test_each_xdist_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup",
                             "-v", "-p", "no:cacheprovider", f"--rootdir={tmp_path}",
                             str(tmp_path / "test_grouped.py")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            # Only this run's options: not the suite's own (a plugin it loads).
                            env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d)\] .*PASSED .*::test_(first|second)\[\d\]", result.stdout, re.M)
    assert len(ran) == 8, result.stdout[-3000:]
    workers = {group: {worker for worker, g in ran if g == group} for group in ("first", "second")}
    assert all(len(w) == 1 for w in workers.values()), (workers, result.stdout[-3000:])


def test_a_failing_test_leaves_none_of_the_processes_it_started_running():
    """conftest's ``pytest_runtest_call`` wrapper, driven as pytest drives it: a process started
    in a test's body is killed where the test fails, and left alone where it passes."""
    import conftest

    for failed in (False, True):
        wrapper = conftest.pytest_runtest_call(None)
        next(wrapper)
        started = subprocess.Popen(["sleep", "60"])
        with pytest.raises(StopIteration):
            wrapper.send(SimpleNamespace(excinfo=(AssertionError, AssertionError(), None)
                                         if failed else None))
        try:
            assert started.wait(10) == -9 if failed else started.poll() is None
        finally:
            started.kill()
            started.wait()
