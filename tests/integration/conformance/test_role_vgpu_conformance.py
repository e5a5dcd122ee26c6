"""The vgpu_conformance role with ansible-playbook against the API server double and the fake
controller; fake GPU node hosts carry their facts as host vars (`vgpu_profiles_gpus` for gpu-a,
the vgpu_facts `vgpu` fact for gpu-b), as a fact cache or playbooks/conformance.yml would."""

from __future__ import annotations

import json
import sys

from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import run_playbook
from ansible_collections.accelops.vgpu.tests.integration.conformance.conformance_helpers import (
    NAMESPACES, NODE_FACTS, RTX_PRO_RES, healthy_state, passthrough_state)

FAST = {"vgpu_conformance_running_timeout": 10, "vgpu_conformance_ready_timeout": 10,
        "vgpu_conformance_pending_timeout": 2, "vgpu_conformance_cleanup_timeout": 10,
        "vgpu_conformance_poll_interval": 0.2}


def run_role(tmp_path, kubeconfig, role_vars=None, check=False):
    inventory = {"all": {"children": {
        "vgpu_nodes": {"hosts": {"gpu-a": {"vgpu_profiles_gpus": NODE_FACTS["gpu-a"]["gpus"]},
                                 "gpu-b-host": {"kubevirt_vgpu_node_name": "gpu-b", "vgpu": NODE_FACTS["gpu-b"]}}},
        "vgpu_cluster": {"hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}}}}}}
    role_vars = dict(FAST, vgpu_conformance_kubeconfig=kubeconfig,
                     vgpu_conformance_report_dir=str(tmp_path / "report"), **(role_vars or {}))
    play = [{"name": "Attest", "hosts": "vgpu_cluster[0]", "gather_facts": False,
             "roles": [{"role": "accelops.vgpu.vgpu_conformance", **role_vars}]}]
    return run_playbook(tmp_path, inventory, play, check)


def task_output(stdout, task):
    """The first line a task printed after its header."""
    after = stdout.split("TASK [accelops.vgpu.vgpu_conformance : %s]" % task, 1)[1]
    return [line for line in after.splitlines()[1:] if line.strip()][0]


def test_role_attests_a_healthy_cluster_with_the_nodes_facts_and_writes_the_report(
        cluster, controller, kubeconfig, tmp_path):
    controller()
    proc = run_role(tmp_path, kubeconfig)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report" / "vgpu-conformance.json").read_text())
    status = dict(((r["check"], r["subject"]), r["status"]) for r in report["checks"])
    # the node facts came from both host var shapes, keyed by Kubernetes node name
    assert status["sharing", "L40S-24Q@gpu-a"] == "PASS" and status["sharing", "A16-4Q@gpu-b"] == "PASS"
    assert status["sharing.dra", "L40S-24Q@gpu-a"] == "PASS" and status["over-allocation.dra", "A16-4Q@gpu-b"] == "PASS"
    assert report["summary"] == {"pass": 17, "fail": 0, "unknown": 2, "total": 19}
    assert "17 PASS, 0 FAIL, 2 UNKNOWN of 19 checks" in proc.stdout
    assert "no check failed (2 UNKNOWN: verify those by hand)" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == [
        "vgpu-conformance.json", "vgpu-conformance.junit.xml", "vgpu-conformance.md"]
    assert task_output(proc.stdout, "Delete what the run left behind") == "skipping: [localhost]"


def test_role_passes_a_cluster_that_also_passes_a_whole_gpu_through(cluster, controller, kubeconfig, tmp_path):
    cluster.reset(passthrough_state())
    controller()
    for check in (True, False):
        proc = run_role(tmp_path, kubeconfig, check=check)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "0 FAIL" in proc.stdout
    report = json.loads((tmp_path / "report" / "vgpu-conformance.json").read_text())
    status = dict(((r["check"], r["subject"]), r["status"]) for r in report["checks"])
    assert status["inventory", RTX_PRO_RES] == "UNKNOWN" and report["summary"]["fail"] == 0


def test_role_fails_the_play_on_a_failed_check_after_writing_the_report(cluster, controller, kubeconfig, tmp_path):
    controller(block_overallocation=False)
    proc = run_role(tmp_path, kubeconfig, {"vgpu_conformance_profiles": ["A16-4Q"]})
    assert proc.returncode != 0
    assert "over-allocation A16-4Q@gpu-b: VMI vgpu-conformance-a16-4q-extra (number 5 on 4 vGPU(s)) was placed on gpu-b" \
        in proc.stdout
    assert "over-allocation.dra A16-4Q@gpu-b: ResourceClaim vgpu-conformance-dra-a16-4q-extra (number 5 for 4 A16-4Q " \
        "device(s) on gpu-b) was allocated gpu-b/" in proc.stdout
    report = json.loads((tmp_path / "report" / "vgpu-conformance.json").read_text())
    assert report["summary"]["fail"] == 2


def test_role_check_mode_creates_and_writes_nothing(cluster, kubeconfig, tmp_path):
    proc = run_role(tmp_path, kubeconfig, {"vgpu_conformance_dra_device_class": "no-such.example.com"}, check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "UNKNOWN sharing.dra vgpu.accelops.io: DeviceClass no-such.example.com does not exist" in proc.stdout
    assert [e for e in cluster.log() if e["method"] in ("POST", "PUT", "PATCH", "DELETE")] == []
    assert not (tmp_path / "report").exists()
    assert "(check mode: nothing created)" in proc.stdout


def test_role_always_step_removes_a_leftover_of_a_killed_run(cluster, kubeconfig, tmp_path):
    state = healthy_state()
    state["objects"].append({"resource": NAMESPACES, "name": "vgpu-conformance", "body": {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "vgpu-conformance", "labels": {"accelops.io/vgpu-conformance": "0123abcd"}}}})
    cluster.reset(state)
    proc = run_role(tmp_path, kubeconfig)
    assert proc.returncode != 0
    assert "namespace vgpu-conformance is left from run 0123abcd: delete it first (state=absent)" in proc.stdout
    assert task_output(proc.stdout, "Delete what the run left behind") == "changed: [localhost]"
    assert [(e["method"], e["path"]) for e in cluster.log() if e["method"] != "GET"] == [
        ("DELETE", "/api/v1/namespaces/vgpu-conformance")]
