"""The cluster a manager describes, read the way each task sees it: Slurm's job-step variables
(``tfdp.cluster.slurm``) and a Kubernetes Indexed Job pod's (``tfdp.cluster.kubernetes``), into
the same ``TF_CONFIG`` roles. Real Slurm runs are in ``test_slurm.py``; a pod's view, run as
processes on emulated hosts, at the end here."""

import json
import subprocess
import sys

import pytest

from processes import child_env
from tfdp.cluster import kubernetes, managed, slurm, slurm_nodes, task_gpus, tf_config
from tfdp.util.errors import UserError


def test_slurm_forms_expand_as_slurm_writes_them():
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_counts("1") == [1]
    assert slurm.expand_ports("12000-12002,12010") == [12000, 12001, 12002, 12010]
    assert slurm.task_nodes([2, 1], "block") == [0, 0, 1]
    assert slurm.task_nodes([2, 1], "cyclic") == [0, 1, 0]
    assert slurm.task_nodes([1, 3], "cyclic:block") == [0, 1, 1, 1]
    with pytest.raises(UserError, match="block or cyclic"):
        slurm.task_nodes([2], "arbitrary")
    with pytest.raises(UserError, match="not Slurm's form"):
        slurm.expand_counts("2x3")


def test_the_node_list_expands_as_scontrol_writes_it_out_and_hosts_are_the_users():
    """The lists compared with ``scontrol show hostnames`` under the real Slurm
    (test_slurm.py); the hosts: node names, a pattern of them, or the address on a network."""
    assert slurm_nodes.expand("node[1-3,07-08],solo") == ["node1", "node2", "node3", "node07",
                                                         "node08", "solo"]
    assert slurm_nodes.expand("rack[1-2]-n[01-02]") == ["rack1-n01", "rack1-n02", "rack2-n01",
                                                        "rack2-n02"]
    for bad in ("", "node[1-", "node[2-1]", "a,,b", "n[x]"):
        with pytest.raises(UserError, match="SLURM_STEP_NODELIST="):
            slurm_nodes.expand(bad)
    assert slurm_nodes.hosts(["n1", "n2"], {}) == ["n1", "n2"]
    assert slurm_nodes.hosts(["n1"], {"TFDP_NODE_HOST": "{node}-ib.fast"}) == ["n1-ib.fast"]
    with pytest.raises(UserError, match=r"^TFDP_NODE_HOST='\{host\}-ib' must name each node"):
        slurm_nodes.hosts(["n1"], {"TFDP_NODE_HOST": "{host}-ib"})
    local = {"TFDP_NETWORK": "127.0.0.0/8"}
    assert slurm_nodes.hosts(["localhost"], local) == ["127.0.0.1"]
    with pytest.raises(UserError, match=r"^node host 'localhost' resolves to .*127\.0\.0\.1.*, "
                                        r"none in TFDP_NETWORK=10\.1\.0\.0/16: name the network"):
        slurm_nodes.hosts(["localhost"], {"TFDP_NETWORK": "10.1.0.0/16"})
    with pytest.raises(UserError, match="TFDP_NETWORK='fast' is not a network"):
        slurm_nodes.hosts(["localhost"], {"TFDP_NETWORK": "fast"})
    with pytest.raises(UserError, match="^node host 'no-such-node.invalid' does not resolve"):
        slurm_nodes.hosts(["no-such-node"], {"TFDP_NODE_HOST": "{node}.invalid", **local})


def _step(procid, tasks_per_node="2,1", job="1234", **extra):
    return {"SLURM_PROCID": str(procid), "SLURM_STEP_NODELIST": "node[1-2]",
            "SLURM_STEP_TASKS_PER_NODE": tasks_per_node, "SLURM_STEP_NUM_TASKS": "3",
            "SLURM_JOB_ID": job, **extra}


def test_every_task_of_a_step_builds_the_same_cluster_with_ports_apart(monkeypatch):
    monkeypatch.setattr(slurm, "node_hosts", lambda env: ["10.0.0.2", "10.0.0.3"])
    first = slurm.derived_ports(1234, 0, 2)[0]
    assert 10000 <= first and first + 1 < 32768  # Below Linux's ephemeral ports.
    found = [slurm.step_task("manual", 1, _step(p, SLURM_NODEID=str(n), SLURM_LOCALID=str(l)))
             for p, (n, l) in enumerate([(0, 0), (0, 1), (1, 0)])]
    cluster = {"chief": [f"10.0.0.2:{first}"],
               "worker": [f"10.0.0.2:{first + 1}", f"10.0.0.3:{first}"]}
    assert found == [(cluster, "chief", 0, "1234"), (cluster, "worker", 0, "1234"),
                     (cluster, "worker", 1, "1234")]
    cluster, kind, index, _ = slurm.step_task("parameter_server", 1, _step(2))
    assert (cluster["ps"], kind, index) == ([f"10.0.0.3:{first}"], "ps", 0)
    cluster, kind, index, _ = slurm.step_task("multi_worker", 1, _step(1, "1(x2)",
                                              SLURM_STEP_NUM_TASKS="2"))
    assert cluster == {"worker": [f"10.0.0.2:{first}", f"10.0.0.3:{first}"]} and index == 1
    reserved = _step(1, SLURM_STEP_RESV_PORTS="15000-15001")  # srun --resv-ports
    assert slurm.step_task("manual", 1, reserved)[0]["worker"][0] == "10.0.0.2:15001"
    given = _step(1, TFDP_PORT="23456", SLURM_STEP_RESV_PORTS="15000-15001")  # It wins.
    assert slurm.step_task("manual", 1, given)[0]["worker"] == ["10.0.0.2:23457",
                                                                 "10.0.0.3:23456"]


def test_jobs_and_steps_sharing_nodes_derive_ports_apart():
    """Two jobs whose ids are equal modulo any block count, and two steps of one job, took the
    same ports when ports came from the job id alone."""
    ranges = {(job, step): set(slurm.derived_ports(job, step, 4))
              for job in (12345, 14845, 17345) for step in (0, 1, 2)}
    for a in ranges:
        for b in ranges:
            assert a == b or not ranges[a] & ranges[b], (a, b)
    # Spread over the range: a thousand jobs' first ports mostly differ.
    assert len({slurm.derived_ports(job, 0, 1)[0] for job in range(1000)}) > 950


def test_a_port_taken_or_a_placement_slurm_did_not_make_is_one_line(monkeypatch):
    import socket

    monkeypatch.setattr(slurm, "node_hosts", lambda env: ["127.0.0.1", "10.0.0.3"])
    holder = socket.socket()
    holder.bind(("", 0))
    holder.listen()
    try:
        port = holder.getsockname()[1]
        with pytest.raises(UserError, match=rf"^port {port} of Slurm task 0 \(127\.0\.0\.1:"
                                            rf"{port}\) is already in use on this node: give the "
                                            r"step other ports: TFDP_PORT="):
            slurm.step_task("manual", 1, _step(0, TFDP_PORT=str(port)))
    finally:
        holder.close()
    # Slurm put task 1 on the second node (an arbitrary distribution): tfdp's block reading
    # would give it the first node's second port.
    with pytest.raises(UserError, match=r"^Slurm placed task 1 as task 0 of node 1 of the step; "
                                        r"tfdp's reading .* puts it as task 1 of node 0: give "
                                        r"srun --distribution=block"):
        slurm.step_task("manual", 1, _step(1, SLURM_NODEID="1", SLURM_LOCALID="0"))


def test_slurm_refusals_are_one_line(monkeypatch):
    monkeypatch.setattr(slurm, "node_hosts", lambda env: ["10.0.0.2", "10.0.0.3"])
    assert slurm.step_task("manual", 1, {"SLURM_JOB_ID": "5"}) is None  # A batch script.
    assert slurm.step_task("mirrored", 1, _step(0, "1", SLURM_STEP_NUM_TASKS="1")) is None
    with pytest.raises(UserError, match="trains in one process.*--strategy=multi_worker"):
        slurm.step_task("mirrored", 1, _step(0))
    with pytest.raises(UserError, match="needs a client, a worker and --num_ps=2 parameter"):
        slurm.step_task("parameter_server", 2, _step(0))
    with pytest.raises(UserError, match="reserves 1 port"):
        slurm.step_task("manual", 1, _step(0, SLURM_STEP_RESV_PORTS="15000"))
    partial = {k: v for k, v in _step(0).items() if k != "SLURM_STEP_TASKS_PER_NODE"}
    with pytest.raises(UserError, match="^a Slurm job step without SLURM_STEP_TASKS_PER_NODE: "
                                        "run the tasks with srun"):
        slurm.step_task("manual", 1, partial)


def test_a_job_run_outside_its_steps_says_it_trains_alone_in_one_line():
    """What Slurm sets (read under the real Slurm of test_slurm.py): an sbatch script has the
    job's variables and SLURMD_NODENAME, an salloc shell no SLURMD_NODENAME, a step
    SLURM_STEP_ID."""
    job = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_JOB_NUM_NODES": "2"}
    batch = {**job, "SLURMD_NODENAME": "node1", "SLURM_PROCID": "0"}
    assert slurm.outside_steps(batch) == (
        "in Slurm job 7 (2 task(s) on node[1-2])'s batch script, not in a step of its tasks: "
        "this process trains alone on node1; run it on the job's tasks with srun python -m "
        "tfdp.train ...")
    assert slurm.outside_steps(job).startswith(
        "in Slurm job 7 (2 task(s) on node[1-2])'s salloc shell, not on its nodes: this process "
        "trains alone here, on the submitting host; run it on the job's tasks with srun")
    assert slurm.outside_steps(batch, "python <your script>").endswith(  # tfdp.run's form.
        "run it on the job's tasks with srun python <your script>")
    alone = {**batch, "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1"}
    assert slurm.outside_steps(alone) is None  # One process is what that job asked for.
    assert slurm.outside_steps({**batch, "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1"}) is None
    assert slurm.outside_steps({}) is None


def _pod(index, count=3, **extra):
    return {"JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"train-{index}",
            "TFDP_NUM_TASKS": str(count), "TFDP_SERVICE": "tfdp", **extra}


def test_a_pod_of_an_indexed_job_derives_its_task_from_its_index_and_hostname():
    cluster = {"chief": ["train-0.tfdp:2222"], "worker": ["train-1.tfdp:2222"],
               "ps": ["train-2.tfdp:2222"]}
    assert kubernetes.pod_task("parameter_server", 1, _pod(2)) == (cluster, "ps", 0, "train")
    cluster, kind, index, _ = kubernetes.pod_task("multi_worker", 1, _pod(1, 2, TFDP_PORT="7000"))
    assert cluster == {"worker": ["train-0.tfdp:7000", "train-1.tfdp:7000"]}
    assert (kind, index) == ("worker", 1)
    assert kubernetes.pod_task("manual", 1, {"HOSTNAME": "laptop"}) is None
    for env, match in [(_pod(1, TFDP_SERVICE=""), "without TFDP_SERVICE"),
                       (_pod(3), "outside TFDP_NUM_TASKS=3"),
                       (_pod(1, HOSTNAME="train-7"), "is not <job>-1"),
                       (_pod(1, TFDP_NUM_TASKS="three"), "is not a whole number"),
                       (_pod(0), None)]:
        if match:
            with pytest.raises(UserError, match=match):
                kubernetes.pod_task("manual", 1, env)
    with pytest.raises(UserError, match="trains in one process"):
        kubernetes.pod_task("plain", 1, _pod(0))


@pytest.mark.parametrize("manager, changed, line", [
    ("kubernetes", {"TFDP_PORT": "99999"}, "TFDP_PORT=99999 is out of range: it must be 1..65535"),
    ("kubernetes", {"TFDP_PORT": "0"}, "TFDP_PORT=0 is out of range: it must be 1..65535"),
    ("kubernetes", {"TFDP_PORT": "abc"}, "TFDP_PORT='abc' is not a whole number"),
    ("kubernetes", {"TFDP_NUM_TASKS": "0"}, "TFDP_NUM_TASKS=0 is out of range: it must be at "
                                            "least 1"),
    ("kubernetes", {"JOB_COMPLETION_INDEX": "-1"}, "JOB_COMPLETION_INDEX=-1 is out of range: it "
                                                   "must be at least 0"),
    ("kubernetes", {"TFDP_SERVICE": "Train_Svc"}, "TFDP_SERVICE='Train_Svc' is not a DNS name"),
    ("slurm", {"SLURM_STEP_TASKS_PER_NODE": None}, "a Slurm job step without "
                                                    "SLURM_STEP_TASKS_PER_NODE: run the tasks "
                                                    "with srun"),
    ("slurm", {"SLURM_JOB_ID": None, "SLURM_PROCID": None}, None),  # Not a step: nothing read.
    ("slurm", {"SLURM_JOB_ID": None}, "a Slurm job step without SLURM_JOB_ID"),
    ("slurm", {"SLURM_PROCID": "3"}, "SLURM_PROCID=3 is out of range: it must be 0..2"),
    ("slurm", {"SLURM_STEP_NUM_TASKS": "two"}, "SLURM_STEP_NUM_TASKS='two' is not a whole "
                                               "number"),
    ("slurm", {"SLURM_STEP_NUM_TASKS": "4"}, "SLURM_STEP_TASKS_PER_NODE=2,1 places 3 task(s), "
                                             "SLURM_STEP_NUM_TASKS says 4"),
    ("slurm", {"SLURM_JOB_ID": "12a"}, "SLURM_JOB_ID='12a' is not a whole number"),
    ("slurm", {"SLURM_STEP_RESV_PORTS": "65535-65536"}, "SLURM_STEP_RESV_PORTS='65535-65536' is "
                                                        "not Slurm's form of ports 1..65535"),
    ("tf_config", {"TF_CONFIG": json.dumps({"cluster": {"worker": ["h:1", "h:99999"]},
                                            "task": {"type": "worker", "index": 0}})},
     "TF_CONFIG's worker 1 ('h:99999') has no port 1..65535: give every task as host:port"),
])
def test_a_cluster_setting_out_of_range_is_one_line_naming_it_before_anything_waits(
        monkeypatch, manager, changed, line):
    """Every value read from a manager's environment, checked before a node's name is resolved
    and before TensorFlow: a port of 0 or 99999 used to start the worker, which waited
    for its peers until --collective_timeout; a half-set step was a KeyError."""
    env = {"kubernetes": _pod(1), "slurm": _step(1), "tf_config": {}}[manager]
    env = {k: v for k, v in {**env, **changed}.items() if v is not None}
    asked = []
    monkeypatch.setattr(slurm, "node_hosts",
                        lambda env: asked.append(env) or ["10.0.0.2", "10.0.0.3"])
    if line is None:
        assert managed.described("multi_worker", 1, env) is None
        return
    with pytest.raises(UserError) as caught:
        if manager == "tf_config":
            tf_config.task(env)
        else:
            managed.described("multi_worker", 1, env)
    assert str(caught.value).startswith(line) and "\n" not in str(caught.value)
    assert not asked  # No node's host looked up.


def test_tfdp_train_refuses_a_port_out_of_range_at_once_in_one_line():
    """From outside: a pod whose TFDP_PORT is out of range stops at once (no TensorFlow, no
    waiting), with one line naming the variable."""
    done = subprocess.run([sys.executable, "-m", "tfdp.train", "--strategy=multi_worker",
                           "--collective_timeout=600"], capture_output=True, text=True,
                          env=child_env(**_pod(1, 2, TFDP_PORT="99999")), timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == ("tfdp.train: error: TFDP_PORT=99999 is out of range: it must "
                                   "be 1..65535"), done.stderr
    assert "tensorflow" not in done.stderr.lower()


@pytest.mark.parametrize("strategy, kind, line", [
    ("manual", "worker", "tfdp.train: error: TF_CONFIG: task type 'worker' is not one tfdp.train "
     "--strategy=manual (the client; its workers run python -m tfdp.server) runs (chief)"),
    ("parameter_server", "ps", "tfdp.train: error: TF_CONFIG: task type 'ps' is not one "
     "tfdp.train --strategy=parameter_server (the coordinator; its workers and parameter "
     "servers run python -m tfdp.server) runs (chief)"),
    ("multi_worker", "ps", "tfdp.train: error: TF_CONFIG: task type 'ps' is not one tfdp.train "
     "runs (chief, worker)"),
])
def test_a_task_tfdp_train_is_not_on_its_path_is_refused_before_tensorflow(tmp_path, strategy,
                                                                            kind, line):
    """A hand-written TF_CONFIG naming this process a task its path's tfdp.train is not: one
    line, before TensorFlow starts (a TensorFlow that cannot be imported is first on the path,
    and never tried)."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text("raise ImportError('imported')\n")
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    done = subprocess.run(
        [sys.executable, "-m", "tfdp.train", f"--strategy={strategy}"], capture_output=True,
        text=True, timeout=60, env=child_env(PYTHONPATH=str(tmp_path), TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": kind, "index": 0}})))
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == line, done.stderr


def test_a_hand_written_tf_config_wins_and_a_server_task_becomes_tfdp_server(tmp_path):
    """``managed.join`` in a real process, a script's: a TF_CONFIG given is kept; a pod whose
    role is a worker of the from-scratch path execs ``tfdp.server`` (which refuses a flag in its
    own words), unless the process is interactive (``python -c`` here, a notebook's kernel),
    whose session that would end: one line instead."""
    script = tmp_path / "join.py"
    script.write_text(
        "import dataclasses, json, os, sys, types; from tfdp.cluster import managed; "
        "from tfdp.config.settings import Config; "
        "values = {f.name: f.default for f in dataclasses.fields(Config)}; "
        "values.update(strategy=sys.argv[1], num_ps=1, "
        "**{k: int(v) for k, v in (a.split('=') for a in sys.argv[2:])}); "
        "managed.join(types.SimpleNamespace(**values), caller='tfdp.run'); "
        "print(json.dumps([os.environ['TF_CONFIG'], os.environ.get('TFDP_RUN_STAMP')]))")

    def join(*args, **env):
        return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                              text=True, env=child_env(**env), timeout=120)

    given = json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}})
    done = join("manual", **_pod(0), TF_CONFIG=given)
    assert json.loads(done.stdout.splitlines()[-1]) == [given, None], done.stderr
    done = join("multi_worker", **_pod(1, 2))
    config, stamp = json.loads(done.stdout.splitlines()[-1])
    assert json.loads(config)["task"] == {"type": "worker", "index": 1}
    assert stamp == "kubernetes-train"
    done = join("manual", "num_gpus=0", "lr=1", **_pod(1, 2))
    assert done.stderr.splitlines()[-1] == ("tfdp.server: error: --num_gpus must be a positive "
                                            "integer, got 0"), done.stderr
    done = subprocess.run([sys.executable, "-c", script.read_text(), "manual"],
                          capture_output=True, text=True, env=child_env(**_pod(1, 2)), timeout=120)
    assert done.returncode == 1 and done.stderr.splitlines()[-1].startswith(
        "tfdp.util.errors.UserError: tfdp.run in Kubernetes task worker 0 of --strategy=manual, whose "
        "tasks but the chief are tfdp.servers: an interactive session cannot become one"), (
        done.stderr)
    assert tf_config.roles("manual", 2, 1) == [("chief", 0), ("worker", 0)]
    assert managed.described("manual", 1, {}) is None


def _gpus_of(tasks, strategy="multi_worker", num_gpus=1, **env):
    """What each task of a Slurm step of ``tasks`` ("2,1": per node) sets for its GPUs."""
    kinds = tf_config.roles(strategy, sum(map(int, tasks.split(","))), 1)
    hosts = [f"node{n}:2000" for n, count in enumerate(tasks.split(",")) for _ in range(int(count))]
    cluster = tf_config.cluster_of(hosts, kinds)
    return [task_gpus.assign(env, kind, task_gpus.node_workers(cluster, kind, index), num_gpus)
            for kind, index in kinds]


def test_each_task_takes_its_gpus_by_its_rank_among_the_node_workers_and_the_client_none():
    """The environments Slurm gives (no GPU here: docs/clusters.md says what is not checked):
    --gres=gpu:4 with 4 tasks a node (every task sees all 4), --gpus-per-task=1 (each sees its
    own, renumbered 0), and the from-scratch client, which holds no replica."""
    shared = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    taken = [g["CUDA_VISIBLE_DEVICES"] for g in _gpus_of("4,4", **shared)]
    assert taken == ["0", "1", "2", "3"] * 2
    assert [g["CUDA_VISIBLE_DEVICES"] for g in _gpus_of("2", num_gpus=2, **shared)] == ["0,1",
                                                                                       "2,3"]
    own = _gpus_of("4", CUDA_VISIBLE_DEVICES="0")
    assert own == [{"TF_FORCE_GPU_ALLOW_GROWTH": "true"}] * 4  # Slurm bound them: kept.
    # Slurm lists the GPUs but leaves CUDA_VISIBLE_DEVICES to the tasks.
    assert [g["CUDA_VISIBLE_DEVICES"] for g in _gpus_of("2", SLURM_STEP_GPUS="4,5")] == ["4", "5"]
    # A client and a server on node0, a server on node1, a GPU each: the client takes none.
    manual = _gpus_of("2,1", "manual", CUDA_VISIBLE_DEVICES="0,1")
    assert [g["CUDA_VISIBLE_DEVICES"] for g in manual] == ["", "0", "0"]
    ps = _gpus_of("2,2", "parameter_server", CUDA_VISIBLE_DEVICES="0,1")  # chief, 2 workers, ps
    assert [g["CUDA_VISIBLE_DEVICES"] for g in ps] == ["", "0", "0", ""]
    assert _gpus_of("1", TF_FORCE_GPU_ALLOW_GROWTH="false", CUDA_VISIBLE_DEVICES="") == [{}]
    with pytest.raises(UserError, match=r"^this node's workers share 3 GPU\(s\) \(0, 1, 2\), and "
                                        r"worker 2 of the node needs --num_gpus=2 more: give each "
                                        r"task its own \(srun --gpus-per-task\)"):
        _gpus_of("2", num_gpus=2, CUDA_VISIBLE_DEVICES="0,1,2")


def test_multi_worker_trains_on_the_gpus_num_gpus_says(monkeypatch):
    """MultiWorkerMirroredStrategy takes every GPU TensorFlow lists: the ones past --num_gpus
    are hidden first (TensorFlow's device list as a 4-GPU machine gives it)."""
    import tensorflow as tf

    from tfdp.util import devices

    listed = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(4)]
    hidden = []
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: listed if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices",
                        lambda chosen, kind=None: hidden.append((chosen, kind)))
    assert devices.use_gpus(2) == listed[:2] and hidden == [(listed[:2], "GPU")]
    hidden.clear()
    assert devices.use_gpus(4) == listed and not hidden
