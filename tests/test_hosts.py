"""Emulated hosts (``tfdp.launch --hosts``): real network namespaces, a switch, shaped links,
and nothing left behind, whatever way the launcher ends. Needs root; skips elsewhere."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import REPO
from processes import launch as launch_cluster
from processes import wait_for
from tfdp.launcher import emulated_hosts

pytestmark = [pytest.mark.root("emulated hosts: network namespaces"), pytest.mark.cluster]


def root_network():
    """What the machine's own namespace has: interfaces, addresses, routes."""
    return [subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout
            for args in (["-o", "link"], ["-o", "addr"], ["route"])]


def ours(pid):
    return [n for n in emulated_hosts.namespaces()
            if n.startswith(f"{emulated_hosts.PREFIX}{pid}-")]


def launch(data_dir, tmp_path, *launcher_flags, train=()):
    return launch_cluster(tmp_path, "multi_worker", f"--data_dir={data_dir}", *train,
                          launcher=launcher_flags, popen=True)


def test_a_shaped_link_carries_its_rate_each_way_and_all_is_removed_after():
    before = root_network()
    emulated = emulated_hosts.Hosts(2, "10mbit")
    emulated.create()
    try:
        assert sorted(ours(os.getpid())) == sorted([*emulated.names, emulated.switch])
        size = 1_000_000  # 0.8 s at 10 Mbit/s: bounded in bytes and in time.
        for sender, receiver in ((0, 1), (1, 0)):
            seconds = _transfer(emulated, sender, receiver, size)
            assert size * 8 / 10e6 * 0.9 < seconds < size * 8 / 10e6 * 1.3, seconds
        assert root_network() == before  # The root namespace got nothing.
    finally:
        emulated.remove()
    assert ours(os.getpid()) == []
    assert root_network() == before


def _transfer(emulated, sender, receiver, size):
    server = subprocess.Popen(
        ["ip", "netns", "exec", emulated.names[receiver], sys.executable, "-c",
         "import socket, time\n"
         "s = socket.socket(); s.bind(('0.0.0.0', 5001)); s.listen(); s.settimeout(20)\n"
         "c, _ = s.accept(); n = 0; t = None\n"
         "while True:\n"
         "    d = c.recv(65536)\n"
         "    if not d: break\n"
         "    t = t or time.time(); n += len(d)\n"
         "print(n, time.time() - t)\n"], stdout=subprocess.PIPE, text=True)
    for _ in range(100):  # Until it listens.
        probe = subprocess.run(["ip", "netns", "exec", emulated.names[receiver], "ss", "-ltn"],
                               capture_output=True, text=True)
        if ":5001" in probe.stdout:
            break
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "exec", emulated.names[sender], sys.executable, "-c",
                    "import socket\n"
                    f"c = socket.create_connection(('{emulated.address(receiver)}', 5001), 10)\n"
                    f"c.sendall(b'x' * {size}); c.close()\n"], check=True, timeout=30)
    received, seconds = server.communicate(timeout=30)[0].split()
    assert int(received) == size
    return float(seconds)


@pytest.mark.parametrize("count, link", [(2, None), (3, "100mbit")])
def test_multi_worker_trains_on_emulated_hosts_and_leaves_nothing(tmp_path, data_dir, count,
                                                                  link):
    before = root_network()
    run = launch(data_dir, tmp_path, f"--num_workers={count}", "--hosts",
                 *([f"--link={link}"] if link else []),
                 train=["--epochs=1", "--steps_per_epoch=5", "--eval_steps=1"])
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-3000:]
    for i in range(count):
        assert re.search(rf"^tfdp\.launch: host {i} \(tfdp-{run.pid}-h{i}\) at 10\.\d+\.\d+\."
                         rf"{i + 1} runs worker {i}, link "
                         + (f"{link} each way" if link else "unshaped") + "$", err, re.M), err
    assert f"{count} replica(s) in sync on {count} workers" in err
    assert "[0] test acc" in out and os.listdir(tmp_path / "export") == ["1"]
    assert ours(run.pid) == []
    assert root_network() == before


def test_a_failed_or_interrupted_launch_removes_everything(tmp_path, data_dir):
    failed = launch(data_dir, tmp_path, "--num_workers=2", "--hosts",
                    train=["--no_such_flag=1"])
    failed.communicate(timeout=120)
    assert failed.returncode != 0
    assert ours(failed.pid) == []

    run = launch(data_dir, tmp_path, "--num_workers=2", "--hosts", train=["--epochs=5"])
    wait_for(lambda: len(ours(run.pid)) == 3, 60, "the switch's and two hosts' namespaces")
    run.send_signal(signal.SIGINT)
    run.communicate(timeout=120)
    assert ours(run.pid) == []


def test_what_a_killed_launcher_left_is_removed_by_the_next(tmp_path, data_dir):
    run = launch(data_dir, tmp_path, "--num_workers=2", "--hosts", train=["--epochs=5"])
    wait_for(lambda: len(ours(run.pid)) == 3, 60, "the switch's and two hosts' namespaces")
    run.kill()  # SIGKILL: it cannot clean up.
    run.communicate(timeout=60)
    left = ours(run.pid)
    assert len(left) == 3
    again = launch(data_dir, tmp_path / "again", "--num_workers=1", "--hosts",
                   train=["--help"])
    out, err = again.communicate(timeout=120)
    assert "tfdp.launch: removed what a killed launcher left: " in err
    assert ours(run.pid) == [] and ours(again.pid) == []


def test_without_root_or_with_a_bad_rate_the_launcher_refuses_in_one_line(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "tfdp.launch", "--hosts", "--link=fast", "--",
                          "--help"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip() == ("tfdp.launch: error: --link=fast is not a rate like 10mbit, "
                                  "100mbit or 1gbit")
    # As another user, from a copy of the package that user can read (the checkout may sit in
    # a folder only root enters): skipped, with the reason, where that user cannot run this
    # Python and its packages at all.
    readable = tempfile.mkdtemp(prefix="tfdp-as-nobody-")
    try:
        shutil.copytree(os.path.join(REPO, "tfdp"), os.path.join(readable, "tfdp"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for folder, _, files in os.walk(readable):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)

        def nobody_runs(*args):
            return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534",
                                   "--clear-groups", sys.executable, *args],
                                  capture_output=True, text=True, cwd=readable, timeout=60,
                                  env={**os.environ, "PYTHONPATH": readable,
                                       "PYTHONDONTWRITEBYTECODE": "1"})

        probe = nobody_runs("-c", "import absl.flags, tfdp.launch")
        if probe.returncode != 0:
            pytest.skip(f"user nobody cannot run {sys.executable} with tfdp's packages: "
                        + (probe.stderr.strip().splitlines() or ["no reason given"])[-1])
        as_nobody = nobody_runs("-m", "tfdp.launch", "--hosts", "--", "--help")
    finally:
        shutil.rmtree(readable, ignore_errors=True)
    assert as_nobody.returncode == 2
    assert as_nobody.stderr.strip() == (
        "tfdp.launch: error: --hosts needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create "
        "network namespaces, links and a switch: run the launcher as root")
