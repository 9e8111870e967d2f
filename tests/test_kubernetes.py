"""tfdp on Kubernetes, with no cluster here: docs/kubernetes/'s manifests checked against
Kubernetes' own object schemas (the ``kubernetes`` client's models: every field known and of its
type) and JobSet's (its CRD's schema, vendored in tests/schemas), and two pods of the JobSet run
as its controller runs them: each on an emulated host of its own, with a pod's environment and
hostnames (``<jobset>-<job>-0-<index>.<service>`` resolving there); one pod killed hard, then
the group restarted; one preempted by SIGTERM within the grace period, then the group restarted;
each time resumed from the backup, the model exported once."""

import copy
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from conftest import REPO
from processes import child_env, name_hosts, unname_hosts
from tfdp.util.errors import PREEMPTED_EXIT_CODE

FOLDER = os.path.join(REPO, "docs", "kubernetes")
JOBSET_SCHEMA = os.path.join(REPO, "tests", "schemas", "jobset-v1alpha2.json")


def _objects(name: str) -> dict:
    with open(os.path.join(FOLDER, name)) as f:
        return {o["kind"]: o for o in yaml.safe_load_all(f)}


def _round_trip(obj: dict, kind: str = None) -> dict:
    """``obj`` read into the Kubernetes client's model of its kind and written back: unknown
    fields are dropped, wrong types and missing required fields raise."""
    from kubernetes import client

    api = client.ApiClient()
    model = api.deserialize(json.dumps(obj), f"V1{kind or obj['kind']}", "application/json")
    return api.sanitize_for_serialization(model)


def _jobset_checked(jobset: dict) -> dict:
    """``jobset`` as the API server keeps it: validated against JobSet's schema (types, enums,
    required fields), fields the schema does not know dropped (as the server prunes them), and
    each replicated job's template through the client's JobTemplateSpec."""
    import jsonschema

    with open(JOBSET_SCHEMA) as f:
        schema = json.load(f)
    jsonschema.validate(jobset, schema)

    def known(value, node):
        if isinstance(value, dict) and "properties" in node:
            return {k: known(v, node["properties"][k]) for k, v in value.items()
                    if k in node["properties"]}
        if isinstance(value, list) and "items" in node:
            return [known(v, node["items"]) for v in value]
        return value
    kept = known({k: v for k, v in jobset.items() if k not in ("apiVersion", "kind",
                                                                 "metadata")}, schema)
    for job in kept.get("spec", {}).get("replicatedJobs", []):
        job["template"] = _round_trip(job["template"], "JobTemplateSpec")
    return {**{k: jobset[k] for k in ("apiVersion", "kind", "metadata")}, **kept}


def _pod_env(pod_spec: dict) -> dict:
    return {e["name"]: e["value"] for e in pod_spec["containers"][0]["env"]}


def test_the_manifests_are_kubernetes_objects_and_agree_with_themselves():
    job_file, runs = _objects("tfdp-job.yaml"), _objects("tfdp-runs.yaml")
    for obj in [*job_file.values(), *runs.values()]:
        assert _round_trip(obj) == obj, obj["kind"]
    claim = runs["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # Every pod, on any node.
    job, service = job_file["Job"], job_file["Service"]
    pod = job["spec"]["template"]["spec"]
    env = _pod_env(pod)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == int(env["TFDP_NUM_TASKS"])
    assert service["metadata"]["name"] == pod["subdomain"] == env["TFDP_SERVICE"]
    assert service["spec"]["clusterIP"] == "None"  # Headless: a name per pod.
    assert service["spec"]["publishNotReadyAddresses"] is True  # Named before it is ready.
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert pod["containers"][0]["ports"][0]["containerPort"] == int(env.get("TFDP_PORT", 2222))
    codes = [r["onExitCodes"]["values"] for r in job["spec"]["podFailurePolicy"]["rules"]
             if "onExitCodes" in r]
    assert codes == [[PREEMPTED_EXIT_CODE]]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    # The check can fail: a misspelt field, or a wrong type.
    misspelt = copy.deepcopy(job)
    misspelt["spec"]["template"]["spec"]["subdomian"] = pod["subdomain"]
    assert _round_trip(misspelt) != misspelt
    wrong = copy.deepcopy(job)
    wrong["spec"]["completions"] = "two"
    with pytest.raises(Exception, match="completions"):
        _round_trip(wrong)


def test_the_jobset_restarts_the_whole_group_and_agrees_with_itself():
    import jsonschema

    jobset = _objects("tfdp-jobset.yaml")["JobSet"]
    assert _jobset_checked(jobset) == jobset
    spec = jobset["spec"]
    [workers] = spec["replicatedJobs"]
    job = workers["template"]["spec"]
    pod = job["template"]["spec"]
    env = _pod_env(pod)
    assert workers["replicas"] == 1 and job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == int(env["TFDP_NUM_TASKS"])
    # JobSet's headless Service and the pods' subdomain are named after the JobSet.
    assert env["TFDP_SERVICE"] == jobset["metadata"]["name"] and "subdomain" not in spec["network"]
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    # One pod's failure fails the Job, which restarts every pod; a preemption's does uncounted.
    assert job["backoffLimit"] == 0 and spec["failurePolicy"]["maxRestarts"] >= 1
    preempted = [r for r in job["podFailurePolicy"]["rules"] if "onExitCodes" in r]
    assert preempted == [{"action": "FailJob", "onExitCodes": {
        "operator": "In", "values": [PREEMPTED_EXIT_CODE]}}]
    assert [{k: v for k, v in r.items() if k != "name"} for r in spec["failurePolicy"]["rules"]
            ] == [{"action": "RestartJobSetAndIgnoreMaxRestarts",
                   "onJobFailureReasons": ["PodFailurePolicy"]}]
    claim = _objects("tfdp-runs.yaml")["PersistentVolumeClaim"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    # The checks can fail: a misspelt field of JobSet's or of the Job's, a value JobSet refuses.
    for path in (("spec", "network", "enableDNSHostname"),
                 ("spec", "replicatedJobs", 0, "template", "spec", "completionz")):
        misspelt = copy.deepcopy(jobset)
        node = misspelt
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = True
        assert _jobset_checked(misspelt) != misspelt, path
    wrong = copy.deepcopy(jobset)
    wrong["spec"]["failurePolicy"]["rules"][0]["action"] = "RestartEverything"
    with pytest.raises(jsonschema.ValidationError, match="RestartEverything"):
        _jobset_checked(wrong)


@pytest.mark.cluster
@pytest.mark.root("network namespaces: a pod's address and hostnames")
def test_the_jobsets_pods_restart_as_a_group_after_a_crash_and_a_preemption_and_resume(
        tmp_path, data_dir):
    """JobSet's controller, emulated: one pod killed hard (out of memory, its node lost) fails
    the Job, and JobSet deletes the other (SIGTERM, the grace period) and starts both again;
    later one pod deleted (a preemption: both save one common step and exit 75 within the grace
    period) and both started again. Each group resumes from the backup; pod 0 exports once."""
    from tfdp.launcher import emulated_hosts

    jobset = _objects("tfdp-jobset.yaml")["JobSet"]
    [workers] = jobset["spec"]["replicatedJobs"]
    pod = workers["template"]["spec"]["template"]["spec"]
    env = _pod_env(pod)
    count, service, grace = (int(env["TFDP_NUM_TASKS"]), env["TFDP_SERVICE"],
                             pod["terminationGracePeriodSeconds"])
    job = f"{jobset['metadata']['name']}-{workers['name']}-0"  # JobSet's name for its Job.
    hosts = emulated_hosts.Hosts(count)
    hosts.create()
    try:
        # What the cluster's DNS answers in a pod.
        name_hosts(hosts, "".join(f"{hosts.address(i)} {job}-{i}.{service} {job}-{i}\n"
                                  for i in range(count)))
        # A pod whose peer crashed waits inside a collective for --collective_timeout, then
        # ends with the lost-contact line (a SIGTERM meanwhile is read only after it): 20 s
        # here, well within the grace period.
        args = ["--strategy=multi_worker", f"--data_dir={data_dir}", "--epochs=3",
                "--steps_per_epoch=100", "--batch_size=64", "--eval_steps=1",
                "--collective_timeout=20", f"--workdir={tmp_path / 'runs'}",
                f"--export_dir={tmp_path / 'saved'}"]
        backups = tmp_path / "runs" / "backup" / "worker-0"  # step-<n>.npz each epoch

        def start_group():
            return [subprocess.Popen(
                ["ip", "netns", "exec", hosts.names[i], sys.executable, "-m", "tfdp.train",
                 *args], env=child_env(JOB_COMPLETION_INDEX=str(i), HOSTNAME=f"{job}-{i}",
                                       **env),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
                for i in range(count)]

        def kept():
            return set(os.listdir(backups)) if backups.exists() else set()

        def a_new_backup(pods, than=()):
            """Wait for an epoch's backup the group ``pods`` wrote: one not among ``than``."""
            deadline = time.time() + 180
            while time.time() < deadline:
                assert all(p.poll() is None for p in pods), pods[0].communicate()[1][-3000:]
                if kept() - set(than):
                    return
                time.sleep(0.05)
            raise AssertionError("no new backup within 180 s")

        def ended(pods, within):
            """Each pod's output once it exits; past ``within`` seconds, SIGKILL (as Kubernetes
            at the grace period's end) and fail."""
            try:
                return [p.communicate(timeout=within) for p in pods]
            except subprocess.TimeoutExpired:
                for p in pods:
                    p.kill()
                raise AssertionError(f"a pod outlived {within} s: "
                                     + pods[0].communicate()[1][-3000:]) from None

        pods = start_group()
        a_new_backup(pods)
        pods[1].kill()  # A hard crash: the Job fails; JobSet deletes the group's other pods.
        pods[0].send_signal(signal.SIGTERM)
        crashed = ended(pods, grace)
        assert pods[1].returncode == -signal.SIGKILL and "Traceback" not in crashed[0][1], (
            crashed[0][1][-3000:])
        assert re.search(r"^tfdp\.train: error: lost contact with the cluster .*: unreachable "
                         rf"now: worker 1 \({job}-1\.{service}:2222\); the backup of step \d+ "
                         "is kept", crashed[0][1], re.M), crashed[0][1][-3000:]
        derived = re.search(r"Kubernetes: worker 0 of (\{.*\})$", crashed[0][1], re.M)
        assert derived, crashed[0][1][-3000:]
        assert json.loads(derived[1]) == {"worker": [f"{job}-{i}.{service}:2222"
                                                     for i in range(count)]}

        before = kept()
        pods = start_group()  # Restarted as a group: it resumes, then a pod is deleted.
        a_new_backup(pods, before)
        pods[1].send_signal(signal.SIGTERM)
        sent = time.time()
        preempted = ended(pods, grace)
        print(f"both pods saved and exited {PREEMPTED_EXIT_CODE} {time.time() - sent:.1f} s "
              f"after SIGTERM (grace period {grace} s)")
        assert [p.returncode for p in pods] == [PREEMPTED_EXIT_CODE] * 2, preempted[0][1][-3000:]
        assert "resuming at epoch" in "".join(preempted[0]), preempted[0][1][-3000:]

        pods = start_group()  # Restarted, uncounted: it resumes and finishes.
        finished = ended(pods, 300)
        assert [p.returncode for p in pods] == [0, 0], finished[0][1][-3000:]
        assert "resuming at epoch" in "".join(finished[0])
        assert os.listdir(tmp_path / "saved") == ["1"]
    finally:
        hosts.remove()
        unname_hosts(hosts)


def _elastic_job() -> tuple:
    """tfdp-elastic-job.yaml's Job, its pod's spec and environment, and its tfdp.launch flags
    (the launcher's own, the workers')."""
    job = _objects("tfdp-elastic-job.yaml")["Job"]
    pod = job["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    split = args.index("--")
    return job, pod, _pod_env(pod), args[:split], args[split + 1:]


def test_the_elastic_job_is_a_kubernetes_job_whose_group_the_launcher_accepts():
    """tfdp-elastic-job.yaml: Kubernetes objects; MAX pods (completions, parallelism,
    TFDP_NUM_TASKS, --num_workers' MAX agree), each replaced when lost (backoffLimitPerIndex)
    and, stopped after saving (75) or disrupted, replaced uncounted; the pods' flags are ones
    tfdp.launch runs in such a pod, without a one-line refusal."""
    from tfdp.launcher import elastic, managed_group
    from tfdp.launcher.local_cluster import workers_config

    for obj in _objects("tfdp-elastic-job.yaml").values():
        assert _round_trip(obj) == obj, obj["kind"]
    job, pod, env, own, workers = _elastic_job()
    assert pod["containers"][0]["command"] == ["python", "-m", "tfdp.launch"]
    [asked] = [a.split("=", 1)[1] for a in own if a.startswith("--num_workers=")]
    (low, high), problem = elastic.sizes(asked)
    assert not problem and low < high
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == high == int(
        env["TFDP_NUM_TASKS"])
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["backoffLimitPerIndex"] >= 1
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == env["TFDP_SERVICE"]
    codes = [r["onExitCodes"]["values"] for r in job["spec"]["podFailurePolicy"]["rules"]
             if "onExitCodes" in r]
    assert codes == [[PREEMPTED_EXIT_CODE]]
    config, problem = workers_config(workers)
    assert not problem, problem
    found = ("Kubernetes", {"worker": [f"p-{i}.s:2222" for i in range(high)]}, "worker", 0, "p")
    assert managed_group.refusal(found, (low, high), config, False, 0) == ""
    assert elastic.refusal(low, high, config, False) == ""


@pytest.mark.cluster
@pytest.mark.root("network namespaces: a pod's address and hostnames")
def test_an_elastic_indexed_job_goes_on_without_a_deleted_pod_and_takes_its_replacement_in(
        tmp_path, data_dir, test_split):
    """tfdp-elastic-job.yaml's pods, emulated (each on a host of its own, with its environment
    and hostnames), their flags for a short float64 run: a random pod deleted (SIGTERM) once
    every worker has backed up a random step: it saves its step with the others and exits 75,
    and the other two go on from it; the Job's replacement pod, of the same index, joins at once
    (every worker saves one common step, and the group of 3 resumes from it); the run finishes,
    exports once, and serves, in float64, within 1e-9 the logits of two devices never
    interrupted."""
    import random

    from processes import backed_up
    from same_model import serves_like_two_devices_never_interrupted
    from tfdp.launcher import emulated_hosts

    job, pod, env, own, _ = _elastic_job()
    count, service, name = (int(env["TFDP_NUM_TASKS"]), env["TFDP_SERVICE"],
                            job["metadata"]["name"])
    settings = dict(precision="float64", epochs=2, steps_per_epoch=24, batch_size=48, lr=0.1,
                    eval_steps=1, seed=4)
    args = [*own, "--", "--strategy=multi_worker", f"--data_dir={data_dir}", "--backup_every=4",
            f"--workdir={tmp_path / 'runs'}", f"--export_dir={tmp_path / 'saved'}",
            *[f"--{k}={v}" for k, v in settings.items()]]
    chosen = random.Random()
    step, deleted = chosen.randrange(4, 16, 4), chosen.randrange(count)
    hosts = emulated_hosts.Hosts(count)
    hosts.create()
    pods, said = [], []  # said: every pod's lines, as they come.
    try:
        name_hosts(hosts, "".join(f"{hosts.address(i)} {name}-{i}.{service} {name}-{i}\n"
                                  for i in range(count)))

        def start(i):
            pods.append(subprocess.Popen(
                ["ip", "netns", "exec", hosts.names[i], sys.executable, "-m", "tfdp.launch",
                 *args], env=child_env(JOB_COMPLETION_INDEX=str(i), HOSTNAME=f"{name}-{i}",
                                       **env), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, cwd=tmp_path))
            threading.Thread(target=lambda out=pods[-1].stdout: said.extend(out),
                             daemon=True).start()

        def wait_for(check, what):
            deadline = time.time() + 240
            while not check() and time.time() < deadline:
                time.sleep(0.05)
            assert check(), f"no {what} within 240 s: " + "".join(said)[-3000:]

        for i in range(count):
            start(i)
        wait_for(lambda: backed_up(tmp_path / "runs", count) >= step or any(
            p.poll() is not None for p in pods), f"backup of step {step} by every worker")
        pods[deleted].send_signal(signal.SIGTERM)  # Deleted: the grace period begins.
        pods[deleted].wait(timeout=pod["terminationGracePeriodSeconds"])
        wait_for(lambda: "tfdp.launch: group 1: 2 of" in "".join(said), "group of two")
        start(deleted)  # The Job's replacement, of the same index.
        for p in pods:
            p.wait(timeout=300)
    finally:
        for p in pods:
            if p.poll() is None:
                p.kill()
        hosts.remove()
        unname_hosts(hosts)
    said = "".join(said)
    codes = [0] * (count + 1)  # The replacement last.
    codes[deleted] = PREEMPTED_EXIT_CODE
    assert [p.returncode for p in pods] == codes, said[-4000:]
    assert re.findall(r"tfdp\.launch: worker (\d) left \(its task was stopped, after every "
                      r"worker saved its step\); going on with 2 of --num_workers=2:3", said) == [
        str(deleted)], said[-4000:]
    assert "tfdp.launch: a worker joins (a task came)" in said, said[-4000:]
    # The group goes on by itself: no worker's line sends the user to start it again.
    assert "run the same command again" not in said and re.search(
        r"preempted \(SIGTERM\) at step \d+: .*; a worker leaves: tfdp\.launch "
        r"--num_workers=2:3 re-forms the group from it, one smaller", said), said[-4000:]
    assert re.search(r"tfdp\.launch: group 2: 3 of --num_workers=2:3", said), said[-4000:]
    # The chief of a re-formed group that trains says how soon after the loss or the join.
    assert re.search(rf"^epoch \d/2, step \d+/24: training again \d+\.\d s after (worker "
                     rf"{deleted} left|a worker asked to join)$", said, re.M), said[-4000:]
    assert os.listdir(tmp_path / "saved") == ["1"] and "Traceback" not in said
    serves_like_two_devices_never_interrupted(
        tmp_path / "saved" / "1", tmp_path, data_dir, test_split.images[:256], "mirrored",
        settings, f"pod {deleted} of {count} deleted after step {step}, then replaced")
