"""tfdp on Kubernetes, with no cluster here: docs/kubernetes/tfdp-job.yaml checked against
Kubernetes' own object schema (the ``kubernetes`` client's models: every field known and of its
type), and two pods run as a Kubernetes Indexed Job runs them: each on an emulated host of its
own, with a pod's environment and hostnames (``<job>-<index>.<service>`` resolving there),
preempted by SIGTERM within the manifest's grace period, replaced, resumed."""

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO
from processes import child_env
from tfdp.errors import PREEMPTED_EXIT_CODE

MANIFEST = os.path.join(REPO, "docs", "kubernetes", "tfdp-job.yaml")


def _objects():
    with open(MANIFEST) as f:
        return {o["kind"]: o for o in yaml.safe_load_all(f)}


def _round_trip(obj: dict) -> dict:
    """``obj`` read into the Kubernetes client's model of its kind and written back: unknown
    fields are dropped, wrong types and missing required fields raise."""
    from kubernetes import client

    api = client.ApiClient()
    model = api.deserialize(json.dumps(obj), f"V1{obj['kind']}", "application/json")
    return api.sanitize_for_serialization(model)


def test_the_manifest_is_kubernetes_objects_and_agrees_with_itself():
    objects = _objects()
    for obj in objects.values():
        assert _round_trip(obj) == obj, obj["kind"]
    job, service = objects["Job"], objects["Service"]
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == int(env["TFDP_NUM_TASKS"])
    assert service["metadata"]["name"] == pod["subdomain"] == env["TFDP_SERVICE"]
    assert service["spec"]["clusterIP"] == "None"  # Headless: a name per pod.
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert pod["containers"][0]["ports"][0]["containerPort"] == int(env.get("TFDP_PORT", 2222))
    codes = [r["onExitCodes"]["values"] for r in job["spec"]["podFailurePolicy"]["rules"]
             if "onExitCodes" in r]
    assert codes == [[PREEMPTED_EXIT_CODE]]
    # The check can fail: a misspelt field, or a wrong type.
    misspelt = copy.deepcopy(job)
    misspelt["spec"]["template"]["spec"]["subdomian"] = pod["subdomain"]
    assert _round_trip(misspelt) != misspelt
    wrong = copy.deepcopy(job)
    wrong["spec"]["completions"] = "two"
    with pytest.raises(Exception, match="completions"):
        _round_trip(wrong)


@pytest.mark.cluster
@pytest.mark.root("network namespaces: a pod's address and hostnames")
def test_two_pods_derive_their_cluster_train_and_a_sigterm_saves_within_the_grace_period(
        tmp_path, data_dir):
    from tfdp.launcher import emulated_hosts

    job = _objects()["Job"]
    name, pod = job["metadata"]["name"], job["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    count, service = int(env["TFDP_NUM_TASKS"]), env["TFDP_SERVICE"]
    hosts = emulated_hosts.Hosts(count)
    hosts.create()
    etc = [f"/etc/netns/{n}" for n in hosts.names]
    try:
        # What the cluster's DNS answers in a pod, as `ip netns exec` shows each namespace its
        # own /etc/hosts.
        names = "".join(f"{hosts.address(i)} {name}-{i}.{service} {name}-{i}\n"
                        for i in range(count))
        for folder in etc:
            os.makedirs(folder)
            with open(f"{folder}/hosts", "w") as f:
                f.write("127.0.0.1 localhost\n" + names)
        args = ["--strategy=multi_worker", f"--data_dir={data_dir}", "--epochs=2",
                "--steps_per_epoch=100", "--batch_size=64", "--eval_steps=1",
                f"--workdir={tmp_path / 'runs'}", f"--export_dir={tmp_path / 'saved'}"]

        def start_pods():
            return [subprocess.Popen(
                ["ip", "netns", "exec", hosts.names[i], sys.executable, "-m", "tfdp.train",
                 *args], env=child_env(JOB_COMPLETION_INDEX=str(i), HOSTNAME=f"{name}-{i}",
                                       **env),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
                for i in range(count)]

        pods = start_pods()
        backups = tmp_path / "runs" / "backup"
        deadline = time.time() + 180
        while not (backups.exists() and os.listdir(backups)) and time.time() < deadline:
            assert all(p.poll() is None for p in pods), pods[0].communicate()[1][-3000:]
            time.sleep(0.1)
        pods[1].send_signal(signal.SIGTERM)  # One pod deleted, as Kubernetes deletes it.
        sent = time.time()
        ended = [p.communicate(timeout=pod["terminationGracePeriodSeconds"]) for p in pods]
        saved = time.time() - sent
        for p, (out, err) in zip(pods, ended):
            assert p.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
        print(f"both pods saved and exited {PREEMPTED_EXIT_CODE} {saved:.1f} s after SIGTERM "
              f"(grace period {pod['terminationGracePeriodSeconds']} s)")
        derived = re.search(r"Kubernetes: worker 0 of (\{.*\})$", ended[0][1], re.M)
        assert derived, ended[0][1][-3000:]
        assert json.loads(derived[1]) == {"worker": [f"{name}-{i}.{service}:2222"
                                                     for i in range(count)]}
        # The Job replaces the pods: the same commands resume and finish; pod 0 exports once.
        pods = start_pods()
        ended = [p.communicate(timeout=300) for p in pods]
        assert [p.returncode for p in pods] == [0, 0], ended[0][1][-3000:]
        assert "resuming at epoch" in ended[0][1] + ended[0][0]
        assert os.listdir(tmp_path / "saved") == ["1"]
    finally:
        hosts.remove()
        for folder in etc:
            shutil.rmtree(folder, ignore_errors=True)
