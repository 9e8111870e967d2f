"""tfdp under a real Slurm (``slurm_cluster``: Debian's slurmctld, a slurmd per emulated host,
munge): ``srun`` with no hand-written ``TF_CONFIG`` trains the model two local processes train,
on ``multi_worker`` and on the from-scratch path; under docs/clusters.md's batch script,
``scancel --signal=TERM`` mid-epoch saves, the job requeues itself and resumes mid-epoch, and
stops requeueing after ``max_requeues``; a node lost with its task ends the job in one line;
node lists expand as ``scontrol`` writes them; ``tfdp.run`` in a script joins the step."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import REPO
from processes import child_env, launch
from slurm_cluster import SlurmCluster, missing
from tfdp.config.settings import LIVE_PROGRESS_ENV

# One worker runs them all (xdist_group): the module's Slurm is started once.
pytestmark = [pytest.mark.cluster, pytest.mark.root("a slurmd per network namespace"),
              pytest.mark.xdist_group("slurm")]
TRAIN = [sys.executable, "-m", "tfdp.train"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()
    # Nothing the cluster ran is left: no daemon, step or task in any of its namespaces.
    assert not [n for n in cluster.hosts.names if os.path.exists(f"/run/netns/{n}")
                or os.path.exists(f"/etc/netns/{n}")]


def _env():
    """The tasks' environment: the tests' (the venv, the data), none of a Slurm around them."""
    return {k: v for k, v in child_env().items() if not k.startswith("SLURM_")}


def _logits(version, images):
    import tensorflow as tf

    serve = tf.saved_model.load(str(version)).signatures["serving_default"]
    return serve(images=tf.constant(images))["logits"].numpy()


@pytest.mark.parametrize("strategy,tasks", [("multi_worker", 2), ("manual", 3),
                                            ("parameter_server", 4)])
def test_srun_trains_the_model_two_local_processes_train(slurm, tmp_path, data_dir, test_split,
                                                         strategy, tasks):
    """Float64: the same model to rounding, whether the two workers are Slurm tasks on two
    nodes (``srun -N2``; the from-scratch path's client is a third task) or ``tfdp.launch``'s
    local processes. The from-scratch path runs as a user's script of ``tfdp.run`` (``srun
    python script.py``): its chief returns, the other tasks become servers. Parameter servers (a
    client, 2 workers and ``--num_ps=1``: asynchronous, so no model to compare) train and
    export."""
    flags = [f"--strategy={strategy}", f"--data_dir={data_dir}", "--precision=float64",
             "--epochs=1", "--steps_per_epoch=4", "--eval_steps=1", "--batch_size=64"]
    if strategy == "parameter_server":
        flags = flags[:2] + flags[3:] + ["--num_ps=1"]
    places = [f"--workdir={tmp_path / 'slurm'}", f"--export_dir={tmp_path / 'exported'}"]
    command = [*TRAIN, *flags, *places]
    if strategy == "manual":
        script = tmp_path / "train_script.py"
        given = (flag[2:].split("=", 1) for flag in flags + places)
        script.write_text("import tfdp\n\nresult = tfdp.run(" + ", ".join(
            f"{name}={int(value) if value.isdigit() else value!r}" for name, value in given)
            + ")\nprint('tfdp.run returned', result.export_path, flush=True)\n")
        command = [sys.executable, str(script)]
    done = slurm.run("srun", "-N2", f"-n{tasks}", "--kill-on-bad-exit=1", *command,
                     env=_env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:] + slurm.logs()
    derived = re.findall(r"Slurm: (\w+) (\d+) of (\{.*\})$", done.stderr, re.M)
    # Each node by its name, resolved on the nodes (slurm_cluster names them so): no scontrol.
    assert len(derived) == tasks and {a.rsplit(":", 1)[0] for a in re.findall(
        r'"([\w.]+:\d+)"', derived[0][2])} == {"node1", "node2"}, done.stderr[-3000:]
    assert os.listdir(tmp_path / "exported") == ["1"]  # The chief exported, once.
    assert [kind for kind, _, _ in derived].count("chief") == (strategy != "multi_worker")
    if strategy == "manual":  # The chief returned; the servers never came back to the script.
        assert done.stdout.count("tfdp.run returned") == 1, done.stdout
    if strategy == "parameter_server":
        assert sorted(json.loads(derived[0][2])) == ["chief", "ps", "worker"]
        return
    local = launch(tmp_path, strategy, *flags[1:], timeout=300)
    assert local.returncode == 0, local.stderr[-3000:]
    images = test_split.images[:200]
    np.testing.assert_allclose(_logits(tmp_path / "exported" / "1", images),
                               _logits(tmp_path / "export" / "1", images), rtol=0, atol=1e-5)


def test_the_node_list_expands_as_scontrol_writes_it_out(slurm):
    """Every task expands its step's node list itself: as ``scontrol show hostnames`` does."""
    from tfdp.cluster import slurm_nodes

    for nodelist in ("node[1-2]", "node[1-3,07-09],solo", "rack[1-2]-n[01-02]", "a[8-11]",
                     "n[1-2],n[2-3]", "c[1,3-4]d[5]", "gpu-a100-[001-003]"):
        listed = slurm.run("scontrol", "show", "hostnames", nodelist)
        assert listed.returncode == 0, listed.stderr
        assert slurm_nodes.expand(nodelist) == listed.stdout.split(), nodelist


def test_a_port_taken_on_a_node_and_a_distribution_tfdp_cannot_read_are_one_line(slurm,
                                                                                tmp_path):
    """Under the real Slurm: a task whose port something on its node already holds stops with
    the line naming it and the remedy; a step placed by ``--distribution=plane`` stops every
    task with the line naming the distributions tfdp reads, before TensorFlow starts."""
    port = 23456
    holder = subprocess.Popen(
        ["ip", "netns", "exec", slurm.hosts.names[1], sys.executable, "-c",
         f"import socket, time; s = socket.socket(); s.bind(('', {port})); s.listen(); "
         "print('held', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        taken = slurm.run("srun", "-N2", "-n2", "--kill-on-bad-exit=1", *TRAIN,
                          "--strategy=multi_worker", env=dict(_env(), TFDP_PORT=str(port)),
                          cwd=tmp_path, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert taken.returncode != 0
    assert (f"tfdp.train: error: port {port} of Slurm task 0 (node1:{port}) is already in use "
            "on this node: give the step other ports: TFDP_PORT=") in taken.stderr, taken.stderr
    plane = slurm.run("srun", "-N2", "-n3", "--distribution=plane=2", *TRAIN,
                      "--strategy=multi_worker", env=_env(), cwd=tmp_path, timeout=120)
    lines = [line for line in plane.stderr.splitlines() if line.startswith("tfdp.train")]
    assert plane.returncode == 1 and len(lines) == 3 and set(lines) == {
        "tfdp.train: error: SLURM_DISTRIBUTION=plane: tfdp builds its cluster for Slurm's block "
        "or cyclic task distribution; give srun --distribution=block"}, plane.stderr


def batch_script(train_flags: str) -> str:
    """docs/clusters.md's batch script, as a user copies it: tfdp from this venv, and
    ``train_flags`` after the script's own (the last value of a flag wins)."""
    with open(os.path.join(REPO, "docs", "clusters.md")) as f:
        script = re.search(r"```bash\n(#!/bin/bash\n#SBATCH .*?)```", f.read(), re.S)[1]
    line = re.search(r"^srun python -m tfdp\.train .*$", script, re.M)[0]
    return script.replace(line, line.replace("python", sys.executable, 1) + " " + train_flags)


def test_tfdp_train_outside_a_step_says_it_trains_alone(slurm, tmp_path, data_dir):
    """``python -m tfdp.train`` without srun, in a two-task job's batch script and in salloc's
    shell: it trains as one process, and says so in one line first."""
    run = [*TRAIN, f"--data_dir={data_dir}", "--epochs=1", "--steps_per_epoch=1",
           "--eval_steps=1", "--batch_size=32"]
    allocated = slurm.run("salloc", "-N2", "-n2", *run, f"--workdir={tmp_path / 'salloc'}",
                          f"--export_dir={tmp_path / 'exported'}", env=_env(), cwd=tmp_path,
                          timeout=300)
    assert allocated.returncode == 0, allocated.stderr[-3000:]
    assert re.search(r"^warning: in Slurm job \d+ \(2 task\(s\) on node\[1-2\]\)'s salloc "
                     r"shell, not on its nodes: this process trains alone here", allocated.stderr,
                     re.M), allocated.stderr[-3000:]
    script = tmp_path / "alone.sbatch"
    script.write_text("#!/bin/bash\n" + " ".join(
        [*run, f"--workdir={tmp_path / 'batch'}", f"--export_dir={tmp_path / 'exported'}"]))
    batch = slurm.run("sbatch", "-W", "-N2", "-n2", f"--chdir={tmp_path}",
                      f"--output={tmp_path}/job.out", str(script), env=_env(), timeout=300)
    text = (tmp_path / "job.out").read_text()
    assert batch.returncode == 0, batch.stderr + text[-3000:]
    assert re.search(r"^warning: in Slurm job \d+ \(2 task\(s\) on node\[1-2\]\)'s batch "
                     r"script, not in a step of its tasks: this process trains alone on node1; run "
                     r"it on the job's tasks with srun python -m tfdp.train", text, re.M), text
    assert text.count("exported ") == 1


def test_two_steps_of_one_job_side_by_side_on_the_same_nodes_both_train(slurm, tmp_path,
                                                                       data_dir):
    """Two ``srun --exact`` steps of one four-task job at once, each two multi_worker tasks on
    the same two nodes: each step's tasks derive ports of their own (they took the same ports
    when the job id alone chose them)."""
    def step(name):
        return " ".join([*TRAIN, "--strategy=multi_worker", f"--data_dir={data_dir}",
                         "--epochs=1", "--steps_per_epoch=2", "--eval_steps=1", "--batch_size=32",
                         f"--workdir={tmp_path / name}", f"--export_dir={tmp_path / name}-export"])
    script = tmp_path / "steps.sbatch"
    script.write_text("#!/bin/bash\n" + "".join(
        f"srun -N2 -n2 --exact --kill-on-bad-exit=1 {step(name)} &\n" for name in "ab")
        + "wait\n")
    batch = slurm.run("sbatch", "-W", "-N2", "-n4", f"--chdir={tmp_path}",
                      f"--output={tmp_path}/job.out", str(script), env=_env(), timeout=300)
    text = (tmp_path / "job.out").read_text()
    assert batch.returncode == 0, batch.stderr + text[-3000:] + slurm.logs()
    clusters = {c for c in re.findall(r"Slurm: worker \d of (\{.*\})$", text, re.M)}
    assert len(clusters) == 2, text[-3000:]  # One per step, each task of it agreeing.
    ports = [set(re.findall(r":(\d+)\"", c)) for c in clusters]
    assert not ports[0] & ports[1], clusters
    assert os.listdir(tmp_path / "a-export") == os.listdir(tmp_path / "b-export") == ["1"]


def test_scancel_term_mid_epoch_saves_and_the_requeued_job_resumes_mid_epoch(slurm, tmp_path,
                                                                           data_dir):
    script = tmp_path / "train.sbatch"
    script.write_text(batch_script(f"--recipe=textbook --data_dir={data_dir} --epochs=2 "
                                   "--steps_per_epoch=120 --batch_size=64 --eval_steps=1"))
    # The chief's progress line in job.out says which step it is at (as in a terminal).
    submitted = slurm.run("sbatch", "--parsable", f"--chdir={tmp_path}",
                          f"--output={tmp_path}/job.out", str(script),
                          env=dict(_env(), **{LIVE_PROGRESS_ENV: "1"}))
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    output = tmp_path / "job.out"
    folder = tmp_path / "runs" / "tfdp"  # The script's --workdir: the requeued job's too.
    # Somewhere in epoch 2's first third, seen in its progress line: a second after epoch 1's
    # line was once still at its end on a loaded machine (the state saved was step 120's).
    chosen = int(np.random.default_rng().integers(3, 40))
    progress = re.compile(r"epoch 2/2 +(\d+)/120 ")
    slurm.wait_for(lambda: output.exists() and any(
        int(k) >= chosen for k in progress.findall(output.read_text())), 180,
        f"epoch 2's step {chosen} in job.out")
    assert slurm.run("scancel", "--signal=TERM", job).returncode == 0
    # Requeued, it passes through states of its own (the run that ended, then REQUEUED) before
    # it is pending again.
    slurm.wait_for(lambda: (slurm.job(job).get("Restarts"), slurm.job(job).get("JobState"))
                   == ("1", "PENDING"), 120, "the job requeued and pending")
    # It starts again once its old credential has expired (slurm_cluster.CRED_EXPIRE): started
    # sooner (scontrol update StartTime=now), a node refuses it ("Job credential revoked").
    try:
        slurm.wait_for(lambda: slurm.job(job).get("JobState") == "COMPLETED", 300,
                       "the requeued job to complete")
    except AssertionError as e:
        raise AssertionError(f"{e}: {slurm.job(job).get('JobState')}\n"
                             f"{output.read_text()[-3000:]}\n{slurm.logs()}") from None
    text = output.read_text()
    preempted = re.search(r"preempted \(SIGTERM\) at step (\d+): state of step \1 saved", text)
    assert preempted, text[-3000:]
    step = int(preempted[1])
    assert 120 < step < 240, text[-3000:]  # In epoch 2.
    assert f"resuming at epoch 2/2, step {step - 120}/120 (global step {step})" in text
    epochs = json.loads((folder / "metrics.json").read_text())["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert text.count("exported ") == 1 and os.listdir(tmp_path / "saved_models" / "lenet") == [
        "1"], text[-3000:]


def test_the_batch_script_requeues_at_most_max_requeues_times(slurm, tmp_path):
    """docs/clusters.md's script around a step that is preempted every time (its tasks exit 75
    at once): requeued while SLURM_RESTART_COUNT is under max_requeues (1 here), then it ends,
    saying why and how to go on."""
    script = batch_script("").replace("max_requeues=3", "max_requeues=1")
    line = re.search(r"^srun .*$", script, re.M)[0]
    (tmp_path / "preempted.sbatch").write_text(script.replace(line, "srun bash -c 'exit 75'"))
    submitted = slurm.run("sbatch", "--parsable", f"--chdir={tmp_path}",
                          f"--output={tmp_path}/job.out", str(tmp_path / "preempted.sbatch"),
                          env=_env())
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    output = tmp_path / "job.out"
    ended = slurm.wait_for(lambda: slurm.job(job).get("JobState") in ("FAILED", "COMPLETED")
                           and slurm.job(job), 120, "the job to end")
    text = output.read_text()
    assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == ("FAILED", "75:0", "1"), (
        ended, text)
    assert text.count("tfdp job: preempted after 1 requeue(s), max_requeues=1: not requeued; "
                      "its state is saved: sbatch this script again to go on") == 1, text


def test_an_elastic_group_under_srun_no_kill_loses_a_task_or_its_node_and_trains_on(
        slurm, tmp_path, data_dir, test_split):
    """``srun --no-kill -N2 -n3 python -m tfdp.launch --num_workers=2:3``: every task's agent
    agrees on the group through the run folder; once every worker has backed up a random step,
    one task (chosen at random) SIGKILLed from outside, or node2 lost with its task (its
    slurmd, the step's slurmstepd and the task killed, as a node that dies); the two left go on
    without the user, from the newest backup every worker has, at the same global batch: the
    run finishes, exports once, says who left in one line, and serves, in float64, within 1e-9
    the logits of two devices never interrupted. (The cluster is started afresh after a lost
    node, as Slurm keeps its job allocated for a while.)"""
    lost_node = random.Random().random() < 0.5
    try:
        _an_elastic_group_loses(slurm, tmp_path, data_dir, test_split, lost_node)
    finally:
        if lost_node:
            slurm.restart()


def _an_elastic_group_loses(slurm, tmp_path, data_dir, test_split, lost_node: bool):
    from processes import backed_up
    from same_model import serves_like_two_devices_never_interrupted

    settings = dict(precision="float64", epochs=2, steps_per_epoch=24, batch_size=48, lr=0.1,
                    eval_steps=1, seed=4)
    run_dir, chosen = tmp_path / "run", random.Random()
    step, victim = chosen.randrange(4, 20, 4), chosen.randrange(3)
    run = slurm.popen("srun", "-N2", "-n3", "--no-kill", "--label", sys.executable, "-m",
                      "tfdp.launch", "--num_workers=2:3", "--", "--strategy=multi_worker",
                      f"--data_dir={data_dir}", "--backup_every=4", f"--workdir={run_dir}",
                      f"--export_dir={tmp_path / 'export'}",
                      *[f"--{k}={v}" for k, v in settings.items()], env=_env(), cwd=tmp_path)
    lines = []  # (when, line) of the step's output, as srun passes it on.
    readers = [threading.Thread(target=lambda s=stream: lines.extend(
        (time.monotonic(), line) for line in s), daemon=True) for stream in (run.stdout,
                                                                              run.stderr)]
    for reader in readers:
        reader.start()
    try:
        slurm.wait_for(lambda: backed_up(run_dir, 3) >= step or run.poll() is not None, 240,
                       f"every worker's backup of step {step}")
        assert run.poll() is None, "".join(line for _, line in lines)[-3000:]
        agents = {int(r.stem.split("-")[1]): json.loads(r.read_text())["pid"]
                  for r in (run_dir / ".tfdp-group").glob("*/member-*.json")}
        if lost_node:  # Every process in node2's namespace: slurmd, slurmstepd, its task.
            on_node2 = [int(pid) for pid in subprocess.run(
                ["ip", "netns", "pids", slurm.hosts.names[2]], capture_output=True,
                text=True).stdout.split()]
            victim, = [m for m, pid in agents.items() if pid in on_node2]
            for pid in on_node2:
                os.kill(pid, signal.SIGKILL)
        else:
            os.kill(agents[victim], signal.SIGKILL)
        killed = time.monotonic()
        run.wait(timeout=300)
        for reader in readers:
            reader.join(10)
    finally:
        if run.poll() is None:
            run.kill()
    err = "".join(line for _, line in lines)
    resumed = [when for when, line in lines if re.search(r": resuming at epoch", line)]
    assert resumed, err[-4000:]
    print(f"{'node2 lost with task' if lost_node else 'task'} {victim} killed after step {step}: "
          f"the group of 2 resumed {resumed[0] - killed:.1f} s later")
    left = re.findall(r"tfdp\.launch: worker (\d) left \(nothing heard from its task for \d s\); "
                      r"going on with 2 of --num_workers=2:3", err)
    assert left == [str(victim)], err[-4000:]
    assert re.search(r"tfdp\.launch: group 1: 2 of --num_workers=2:3", err), err[-4000:]
    assert re.search(rf"^\d+: epoch \d+/\d+, step \d+/\d+: training again \d+\.\d s after "
                     rf"worker {victim} left$", err, re.M), err[-4000:]
    assert os.listdir(tmp_path / "export") == ["1"], err[-4000:]
    assert not re.search(r"^\d+: Traceback", err, re.M), err[-4000:]
    serves_like_two_devices_never_interrupted(
        tmp_path / "export" / "1", tmp_path, data_dir, test_split.images[:256], "mirrored",
        settings, f"task {victim} of 3 {'lost with its node' if lost_node else 'killed'} after "
        f"step {step}")


def test_a_node_lost_with_its_task_ends_the_job_in_one_line(slurm, tmp_path, data_dir):
    """node2's slurmd and the task on it killed (as a node that dies): the task left on node1
    ends with tfdp's one line naming the lost worker, and the step ends. (The cluster is started
    afresh afterwards: Slurm keeps the lost node's job allocated for a while.)"""
    try:
        _lose_a_node(slurm, tmp_path, data_dir)
    finally:
        slurm.restart()


def _lose_a_node(slurm, tmp_path, data_dir):
    run = slurm.popen("srun", "-N2", "-n2", "--kill-on-bad-exit=1", *TRAIN,
                      "--strategy=multi_worker", f"--data_dir={data_dir}", "--epochs=50",
                      "--steps_per_epoch=50",
                      "--batch_size=64", "--eval_steps=1", "--collective_timeout=20",
                      f"--workdir={tmp_path / 'run'}", f"--export_dir={tmp_path / 'export'}",
                      env=_env(), cwd=tmp_path)
    try:
        slurm.wait_for(lambda: (tmp_path / "run" / "backup").exists() or run.poll() is not None,
                       180, "the first backup")
        assert run.poll() is None, run.communicate()[1][-3000:]
        node2 = slurm.hosts.names[2]
        pids = subprocess.run(["ip", "netns", "pids", node2], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:  # slurmd, the step's slurmstepd and the task.
            os.kill(int(pid), signal.SIGKILL)
        lost = time.time()
        out, err = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
    errors = re.findall(r"^tfdp\.train: error: .*$", err, re.M)
    assert len(errors) == 1 and "lost contact with the cluster" in errors[0], err[-3000:]
    assert "worker 1" in errors[0], errors
    assert not re.search(r"^Traceback", err, re.M), err[-3000:]
    assert time.time() - lost < 200
    print(f"{time.time() - lost:.0f} s to the end of the step: {errors[0]}")
