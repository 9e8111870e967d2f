"""The README's commands, for the tests that run them. A launch command of the README is run by
the test that checks that cluster in depth (``RUN_BY``), with that test's own flags after the
README's (absl keeps a flag's last value): one launch checks both, and tests/test_docs.py runs
only the README's commands no other test runs."""

import os
import re
import shlex

from conftest import REPO

README = os.path.join(REPO, "README.md")

# The README's `python -m tfdp.launch ... -- --strategy=<strategy> ...` (with " --hosts": the one
# on emulated hosts) -> the test that launches it through ``launch_args``.
RUN_BY = {
    "manual --hosts": "tests/test_remote.py::"
                      "test_on_emulated_hosts_the_images_never_pass_through_the_client",
    "multi_worker": "tests/test_multi_worker.py::"
                    "test_two_workers_agree_with_each_other_and_the_manual_path",
    "manual": "tests/test_remote.py::test_two_workers_train_the_model_two_local_devices_train",
    "parameter_server": "tests/test_parameter_server.py::"
                        "test_two_workers_and_two_sharded_servers_train_report_and_export",
}


def blocks(language: str) -> list:
    with open(README) as f:
        return re.findall(rf"^```{language}\n(.*?)^```", f.read(), re.M | re.S)


def commands() -> list:
    """Every line of the README's bash blocks, comments dropped."""
    return [line.split(" #")[0].strip() for block in blocks("bash")
            for line in block.splitlines() if line.strip()]


def launch_command(which: str) -> str:
    """The README's one launch of ``which``: a strategy on local processes, or followed by
    " --hosts" on emulated hosts."""
    strategy, _, hosts = which.partition(" ")
    found = [c for c in commands() if c.startswith("python -m tfdp.launch ")
             and ("--hosts" in c) == bool(hosts) and f" --strategy={strategy}" in c]
    assert len(found) == 1, (which, found)
    return found[0]


def launch_args(which: str) -> tuple:
    """(the launcher's flags, the training flags but --strategy) of ``launch_command``."""
    strategy = which.partition(" ")[0]
    args = shlex.split(launch_command(which))[3:]
    split = args.index("--")
    return args[:split], [a for a in args[split + 1:] if a != f"--strategy={strategy}"]
