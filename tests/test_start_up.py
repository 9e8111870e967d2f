"""A cluster that cannot start, and bad input: a missing peer, a launcher that cannot isolate,
bad TF_CONFIG and ports in use, each refused in one line naming what to change."""

import errno
import json
import os
import re
import socket
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO
from processes import child_env, run_module, train_command
from tfdp.cluster import tf_config
from tfdp.launcher.processes import free_ports
from tfdp.util import files
from tfdp.util.errors import UserError


@pytest.mark.slow
def test_a_missing_peer_ends_start_up_after_collective_timeout_naming_it(tmp_path, data_dir):
    own, peer = free_ports(2)  # Nothing will listen on the peer's.
    tf_config = json.dumps({"cluster": {"worker": [f"127.0.0.1:{own}", f"127.0.0.1:{peer}"]},
                            "task": {"type": "worker", "index": 0}})
    started = time.time()
    result = subprocess.run(
        train_command(data_dir, tmp_path, "--strategy=multi_worker", "--collective_timeout=5"),
        capture_output=True, text=True, env=dict(child_env(), TF_CONFIG=tf_config), cwd=REPO,
        timeout=120)
    assert result.returncode == 1  # Not 137: supervisors read that as out of memory.
    assert time.time() - started < 60
    lines = [l for l in result.stderr.splitlines() if l.startswith("tfdp.train: error:")]
    assert lines == [f"tfdp.train: error: the cluster did not start within "
                     f"--collective_timeout=5 s: never answered: worker 1 (127.0.0.1:{peer}); "
                     "start every worker of TF_CONFIG (python -m tfdp.launch does) or raise "
                     "--collective_timeout"], result.stderr[-2000:]


def test_the_launcher_warns_in_one_line_where_it_cannot_isolate(tmp_path):
    # A user namespace with no capabilities and no right to make further user namespaces: as
    # an unprivileged user on a kernel that forbids unprivileged user namespaces.
    # Whether this machine gives such a namespace is checked first, with the same commands
    # running `true`: where it does not, the test skips with the reason.
    setup = ("echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --inh-caps=-all "
             "--bounding-set=-all ")

    def in_namespace(command):
        return subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c",
                               setup + command], capture_output=True, text=True, cwd=REPO,
                              timeout=120)

    if not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("needs unshare and setpriv (util-linux)")
    probe = in_namespace("true")
    if probe.returncode != 0:
        pytest.skip(f"no user namespace to test in here: {probe.stderr.strip()[:200]}")
    result = in_namespace(f"{sys.executable} -m tfdp.launch --num_workers=1 -- --help")
    warnings = [l for l in result.stderr.splitlines() if l.startswith("tfdp.launch: warning:")]
    assert len(warnings) == 1 and "cannot isolate the workers" in warnings[0], result.stderr
    assert "listen on every interface" in warnings[0]
    assert result.returncode == 0, result.stderr[-2000:]


# --- Bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("index", [2, -1])
def test_tf_config_task_index_out_of_range_is_one_line(tmp_path, index):
    raw = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                            "task": {"type": "worker", "index": index}})
    message = (f"TF_CONFIG: task index {index} is out of range: the cluster has 2 worker "
               "task(s), indexes 0..1")
    with pytest.raises(UserError, match=re.escape(message)):
        tf_config.task({"TF_CONFIG": raw})
    result = run_module("tfdp.train", "--strategy=multi_worker", f"--workdir={tmp_path}",
                        env={"TF_CONFIG": raw}, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == f"tfdp.train: error: {message}", result.stderr


@pytest.mark.parametrize("module, strategy, task", [
    ("tfdp.train", "multi_worker", "worker"),
    ("tfdp.train", "manual", "chief"),
    ("tfdp.server", None, "worker"),
])
def test_a_host_that_does_not_resolve_is_named_within_the_timeout(tmp_path, module, strategy,
                                                                  task):
    """A typo in a peer's name (``.invalid`` never resolves): one line naming that peer and its
    host after --collective_timeout, instead of TensorFlow's wait of the whole timeout that
    ended blaming the peers."""
    port = free_ports(1)[0]
    cluster = {"worker": [f"127.0.0.1:{port}" if task == "worker" else "127.0.0.1:1",
                          "nosuchhost.invalid:2222"]}
    if task == "chief" or module == "tfdp.server":
        cluster["chief"] = [f"127.0.0.1:{port}" if task == "chief" else "127.0.0.1:3"]
    raw = json.dumps({"cluster": cluster, "task": {"type": task, "index": 0}})
    args = ([f"--strategy={strategy}", f"--workdir={tmp_path}"] if strategy else []) + [
        "--collective_timeout=3"]
    start = time.monotonic()
    result = run_module(module, *args, env={"TF_CONFIG": raw}, timeout=180)
    assert result.returncode == 1, result.stderr[-2000:]
    waited = 3
    assert result.stderr.strip().splitlines()[-1] == (
        f"{module}: error: TF_CONFIG's worker 1 (nosuchhost.invalid:2222): the host "
        f"'nosuchhost.invalid' does not resolve (Name or service not known; waited {waited} s): "
        "give its address, or a name this machine resolves"), result.stderr[-2000:]
    assert time.monotonic() - start < waited + 60


def test_a_port_in_use_is_named(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    task = tf_config.Task({"worker": [f"127.0.0.1:{port}", "127.0.0.1:1"]}, "worker", 0)
    try:
        with pytest.raises(UserError, match=f"port {port} of TF_CONFIG's worker 0 "
                                            f"\\(127.0.0.1:{port}\\) is already in use"):
            tf_config.check_addresses(task)
    finally:
        holder.close()
    tf_config.check_addresses(task)  # Free again.


def test_a_worker_whose_port_is_taken_says_which_in_one_line(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    tf_config = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}", "127.0.0.1:1"]},
                            "task": {"type": "worker", "index": 0}})
    try:
        result = run_module("tfdp.train", "--strategy=multi_worker", f"--workdir={tmp_path}",
                            env={"TF_CONFIG": tf_config}, timeout=120)
    finally:
        holder.close()
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"tfdp.train: error: port {port} of TF_CONFIG's worker 0 (127.0.0.1:{port}) is already "
        "in use: stop what holds it or give this task another port")


def test_files_written_through_a_temporary_name_never_follow_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "run").mkdir()
    target = tmp_path / "run" / "metrics.json"
    os.symlink(victim, target)
    files.write_atomic(str(target), lambda f: f.write("{}"))
    assert victim.read_text() == "precious"
    assert not os.path.islink(target) and target.read_text() == "{}"


def test_a_port_this_user_may_not_listen_on_is_one_line(monkeypatch):
    """Ports below 1024 need root: a TF_CONFIG naming one, run by a user, is refused in one
    line, as the server's own start would fail (as root, the refusal is made to happen)."""
    if os.geteuid() == 0:
        class Refused(socket.socket):
            def bind(self, address):
                raise PermissionError(errno.EACCES, "Permission denied")

        monkeypatch.setattr(tf_config.socket, "socket", Refused)
    with pytest.raises(UserError) as caught:
        tf_config.port_taken("127.0.0.1:1")
    assert str(caught.value) == ("this user may not listen on port 1 (127.0.0.1:1): ports below "
                                 "1024 need root; give a port from 1024 up")


@pytest.mark.parametrize("module, strategy, task", [
    ("tfdp.server", None, "worker"),
    ("tfdp.train", "manual", "chief"),
    ("tfdp.train", "parameter_server", "chief"),
    ("tfdp.train", "multi_worker", "worker"),  # A cluster of one worker: a server all the same.
])
def test_a_server_or_chief_whose_port_is_taken_says_which_in_one_line(tmp_path, module, strategy,
                                                                      task):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    own = f"127.0.0.1:{port}"
    cluster = {"chief": [own if task == "chief" else "127.0.0.1:1"],
               "worker": [own if task == "worker" else "127.0.0.1:1"]}
    if strategy == "multi_worker":
        del cluster["chief"]
    if strategy == "parameter_server":
        cluster["ps"] = ["127.0.0.1:2"]
    args = [f"--strategy={strategy}", f"--workdir={tmp_path}"] if strategy else []
    try:
        result = run_module(module, *args, timeout=120, env={"TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": task, "index": 0}})})
    finally:
        holder.close()
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"{module}: error: port {port} of TF_CONFIG's {task} 0 ({own}) is already in use: stop "
        "what holds it or give this task another port"), result.stderr[-2000:]
