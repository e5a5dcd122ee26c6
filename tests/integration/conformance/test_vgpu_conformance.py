"""vgpu_conformance against the API server double and the fake KubeVirt controller: verdicts, report
files, errors before anything is created, and cleanup proven from the API request log."""

from __future__ import annotations

import json
import signal
import time
import xml.etree.ElementTree as ET

import pytest

from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import run_module
from ansible_collections.accelops.vgpu.tests.integration.conformance.conformance_helpers import (
    CLAIMS, KUBEVIRT, L40S_RES, NAMESPACES, NODES, RTX_PRO_RES, VMIS, gpu_node, healthy_state, kubevirt_cr, module_args,
    passthrough_state, row, rows, start_module, stored, writes)

NS = "vgpu-conformance"
L40S_VMIS = ["vgpu-conformance-l40s-24q-%d" % i for i in range(1, 5)]
A16_VMIS = ["vgpu-conformance-a16-4q-%d" % i for i in range(1, 5)]
EXTRA = {"L40S-24Q": "vgpu-conformance-l40s-24q-extra", "A16-4Q": "vgpu-conformance-a16-4q-extra"}
DRA_L40S = ["vgpu-conformance-dra-l40s-24q-%d" % i for i in range(1, 5)] + ["vgpu-conformance-dra-l40s-24q-extra"]
DRA_A16 = ["vgpu-conformance-dra-a16-4q-%d" % i for i in range(1, 5)] + ["vgpu-conformance-dra-a16-4q-extra"]
VMI_PATH = "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances" % NS
CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims" % NS


@pytest.fixture
def guest_runner(tmp_path):
    """A stand-in for `virtctl ssh`: exits 0 and prints what it ran, except for VMIs named in fail_vmis."""
    script = tmp_path / "fake-virtctl"
    script.write_text("#!/bin/sh\n# args: namespace vmi command\n"
                      "case \"$2\" in *-3) [ -e \"$0.fail\" ] && { echo \"NVIDIA-SMI has failed\" >&2; exit 9; } ;; esac\n"
                      "echo \"ran $3 in $1/$2\"\n")
    script.chmod(0o755)
    return [str(script), "{namespace}", "{vmi}", "{command}"]


def assert_cleaned_up(cluster, vmis, claims=()):
    """Every object the run POSTed was DELETEd again, and none is left."""
    done = writes(cluster)
    assert ("POST", "/api/v1/namespaces") in done
    assert ("DELETE", "/api/v1/namespaces/" + NS) in done
    created_vmis = sum(1 for method, path in done if method == "POST" and path == VMI_PATH)
    assert created_vmis == len(vmis)
    for name in vmis:
        assert ("DELETE", "%s/%s" % (VMI_PATH, name)) in done
        assert stored(cluster, VMIS, name, NS) is None
    assert sum(1 for method, path in done if method == "POST" and path == CLAIM_PATH) == len(claims)
    for name in claims:
        assert ("DELETE", "%s/%s" % (CLAIM_PATH, name)) in done
        assert stored(cluster, CLAIMS, name, NS) is None
    assert stored(cluster, NAMESPACES, NS) is None


def test_a_healthy_cluster_passes_every_check_and_the_files_say_so(
        cluster, controller, kubeconfig, tmp_path, guest_runner):
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, tmp_path, guest_command="nvidia-smi",
                                                            guest_runner=guest_runner))
    assert rc == 0, result.get("msg")
    assert result["changed"] is True
    statuses = [(r["check"], r["subject"], r["status"]) for r in rows(result)]
    assert all(status == "PASS" for _c, _s, status in statuses), statuses
    assert result["summary"] == {"pass": 19, "fail": 0, "unknown": 0, "total": 19}
    checks = [c for c, _s, _st in statuses]
    for check, count in (("inventory", 2), ("accounting", 2), ("sharing", 2), ("over-allocation", 2),
                         ("health.ready", 2), ("health.guest", 2), ("sharing.dra", 2), ("over-allocation.dra", 2),
                         ("consistency", 2), ("consistency.dra", 1)):
        assert checks.count(check) == count, check
    sharing = row(result, "sharing", "L40S-24Q@gpu-a")
    assert "4 VMI(s)" in sharing["reason"] and "2 physical GPU(s)" in sharing["reason"]
    assert sharing["details"]["placement"] == dict((n, "gpu-a") for n in L40S_VMIS)
    assert row(result, "sharing", "A16-4Q@gpu-b")["details"]["gpus"] == ["0000:45:00.0"]
    over = row(result, "over-allocation", "L40S-24Q@gpu-a")
    assert EXTRA["L40S-24Q"] in over["reason"] and "Insufficient %s" % L40S_RES in over["reason"]
    assert row(result, "health.guest", "A16-4Q@gpu-b")["details"]["results"]["vgpu-conformance-a16-4q-1"] == {
        "rc": 0, "output": "ran nvidia-smi in %s/vgpu-conformance-a16-4q-1" % NS}
    assert row(result, "accounting", "gpu-a %s" % L40S_RES)["details"] == {
        "node": "gpu-a", "allocatable": 4, "labels": {"L40S-24Q": 4}, "facts": 4}
    # through claims: the allocation names the vGPU each VM got, on the node's published devices
    shared = row(result, "sharing.dra", "L40S-24Q@gpu-a")
    allocation = shared["details"]["allocation"]
    assert sorted(d for devices in allocation.values() for d in devices) == [
        "gpu-a/vgpu.accelops.io/l40s-24q-0000-41-00-4", "gpu-a/vgpu.accelops.io/l40s-24q-0000-41-00-5", "gpu-a/vgpu.accelops.io/l40s-24q-0000-42-00-4",
        "gpu-a/vgpu.accelops.io/l40s-24q-0000-42-00-5"]
    assert sorted(shared["details"]["parent_gpus"].values()) == ["0000:41:00.0"] * 2 + ["0000:42:00.0"] * 2
    assert "share physical GPU 0000:41:00.0" in shared["reason"]
    assert row(result, "sharing.dra", "A16-4Q@gpu-b")["details"]["gpus"] == ["0000:45:00.0"]
    over = row(result, "over-allocation.dra", "L40S-24Q@gpu-a")
    assert over["reason"].startswith("ResourceClaim vgpu-conformance-dra-l40s-24q-extra (number 5 for 4 L40S-24Q "
                                     "device(s) on gpu-a) stayed unallocated")
    assert over["reason"].endswith("0/3 nodes are available: 1 cannot allocate all claims, 2 node(s) didn't match "
                                   "Pod's node affinity/selector")
    assert "vgpu.accelops.io publishes gpu-a: 4 x L40S-24Q, gpu-b: 4 x A16-4Q" in row(
        result, "consistency.dra", "resource.k8s.io/v1")["reason"]
    assert_cleaned_up(cluster, L40S_VMIS + A16_VMIS + list(EXTRA.values()) + DRA_A16 + DRA_L40S, DRA_A16 + DRA_L40S)
    assert result["cleanup"] == {"deleted": ["Namespace " + NS], "left": []}

    files = result["report_files"]
    assert files == {"json": str(tmp_path / "vgpu-conformance.json"), "markdown": str(tmp_path / "vgpu-conformance.md"),
                     "junit": str(tmp_path / "vgpu-conformance.junit.xml")}
    saved = json.loads((tmp_path / "vgpu-conformance.json").read_text())
    assert saved == result["report"]
    assert saved["schema"] == "accelops.vgpu/conformance/v1"
    assert saved["check_mode"] is False and saved["namespace"] == NS
    assert saved["cluster"] == {"server": cluster.url, "kubevirt": "KubeVirt kubevirt/kubevirt", "version": "v1.9.0"}
    assert saved["profiles"] == ["A16-4Q", "L40S-24Q"]
    assert time.strptime(saved["generated"], "%Y-%m-%dT%H:%M:%SZ")
    assert len(saved["created"]) == 31 and saved["created"][0] == "Namespace " + NS
    for entry in saved["checks"]:
        assert set(entry) == {"check", "requirement", "subject", "status", "reason", "details"}
        assert entry["requirement"] in ("KAR-0003", "KAR-0004")
    markdown = (tmp_path / "vgpu-conformance.md").read_text()
    assert "**19 PASS, 0 FAIL, 0 UNKNOWN** of 19 checks" in markdown
    table = [line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(table) == 19
    for line, entry in zip(table, saved["checks"]):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[:4] == [entry["check"], entry["requirement"], entry["subject"], entry["status"]]
    suite = ET.parse(tmp_path / "vgpu-conformance.junit.xml").getroot()
    assert (suite.tag, suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("testsuites", "19", "0", "0")
    cases = suite.findall("./testsuite/testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("%s.%s" % (e["requirement"], e["check"]), e["subject"]) for e in saved["checks"]]
    assert not suite.findall(".//failure") and not suite.findall(".//skipped")


def test_over_allocation_that_is_not_blocked_fails(cluster, controller, kubeconfig):
    controller(block_overallocation=False)
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, profiles=["L40S-24Q"]))
    assert rc == 0, result.get("msg")
    over = row(result, "over-allocation", "L40S-24Q@gpu-a")
    assert over["status"] == "FAIL"
    assert "%s (number 5 on 4 vGPU(s)) was placed on gpu-a" % EXTRA["L40S-24Q"] in over["reason"]
    assert "over-allocation not blocked" in over["reason"]
    assert row(result, "sharing", "L40S-24Q@gpu-a")["status"] == "PASS"
    # through claims: the broken scheduler hands the fifth claim a device another claim holds
    over_dra = row(result, "over-allocation.dra", "L40S-24Q@gpu-a")
    assert over_dra["status"] == "FAIL"
    assert over_dra["reason"].startswith("ResourceClaim %s (number 5 for 4 L40S-24Q device(s) on gpu-a) was allocated "
                                         "gpu-a/vgpu.accelops.io/l40s-24q-0000-41-00-4 (also allocated to vgpu-conformance-dra-l40s-24q-"
                                         % DRA_L40S[-1])
    assert over_dra["reason"].endswith("): over-allocation not blocked")
    assert row(result, "sharing.dra", "L40S-24Q@gpu-a")["status"] == "PASS"
    assert result["summary"]["fail"] == 2
    assert result["failed_checks"] == ["over-allocation L40S-24Q@gpu-a: " + over["reason"],
                                       "over-allocation.dra L40S-24Q@gpu-a: " + over_dra["reason"]]
    assert_cleaned_up(cluster, L40S_VMIS + [EXTRA["L40S-24Q"]] + DRA_L40S, DRA_L40S)


def test_an_accelerator_the_catalog_does_not_know_is_unknown_not_failed(cluster, controller, kubeconfig):
    state = healthy_state()
    pci = [{"pciVendorSelector": "10DE:26B9", "resourceName": L40S_RES},
           {"pciVendorSelector": "10DE:ABCD", "resourceName": "nvidia.com/NVIDIA_ZX9-8Q"}]
    state["objects"][0]["body"] = kubevirt_cr(pci=pci, mdev=[])
    state["objects"].append({"resource": NODES, "name": "gpu-z", "body": gpu_node(
        "gpu-z", {"ZX9-8Q": 2}, {"nvidia.com/NVIDIA_ZX9-8Q": 2})})
    cluster.reset(state)
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig))
    assert rc == 0, result.get("msg")
    unknown = row(result, "inventory", "nvidia.com/NVIDIA_ZX9-8Q")
    assert unknown["status"] == "UNKNOWN"
    assert unknown["reason"] == ("pciVendorSelector 10DE:ABCD is not in the collection's GPU catalog: unknown "
                                 "accelerator, verify by hand")
    assert row(result, "inventory", L40S_RES)["status"] == "PASS"
    # no node facts for gpu-z: which GPU each VMI uses cannot be known
    assert row(result, "sharing", "ZX9-8Q@gpu-z")["status"] == "UNKNOWN"
    assert not [(r["subject"], r["reason"]) for r in rows(result) if r["status"] == "FAIL"]


def test_a_whole_gpu_passed_through_beside_the_vgpu_nodes_is_not_attested_and_fails_nothing(
        cluster, controller, kubeconfig):
    state = passthrough_state()
    cluster.reset(state)
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig))
    assert rc == 0, result.get("msg")
    assert result["summary"]["fail"] == 0 and result["failed_checks"] == []
    passthrough = row(result, "inventory", RTX_PRO_RES)
    assert passthrough["status"] == "UNKNOWN" and passthrough["details"]["passthrough"] is True
    assert "permitted for passthrough of a whole GPU (gpu-p: 1)" in passthrough["reason"]
    assert "not attested" in passthrough["reason"]
    assert [r["check"] for r in rows(result) if r["subject"].endswith(RTX_PRO_RES)] == ["inventory"]
    assert row(result, "consistency", L40S_RES)["status"] == "PASS"
    assert row(result, "sharing", "L40S-24Q@gpu-a")["status"] == "PASS"
    check_rc, checked = run_module("vgpu_conformance", module_args(kubeconfig), check=True)
    assert check_rc == 0 and checked["summary"]["fail"] == 0, checked


def test_a_vmi_that_never_becomes_ready_fails_by_name_after_the_timeout(cluster, controller, kubeconfig):
    controller(never_ready=["vgpu-conformance-l40s-24q-2"])
    started = time.monotonic()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, profiles=["L40S-24Q"], ready_timeout=2))
    assert rc == 0, result.get("msg")
    assert time.monotonic() - started >= 2
    ready = row(result, "health.ready", "L40S-24Q@gpu-a")
    assert (ready["status"], ready["reason"]) == ("FAIL", "not Ready after 2s: vgpu-conformance-l40s-24q-2")
    assert row(result, "sharing", "L40S-24Q@gpu-a")["status"] == "PASS"
    assert row(result, "health.guest", "L40S-24Q@gpu-a")["status"] == "UNKNOWN"
    assert_cleaned_up(cluster, L40S_VMIS + [EXTRA["L40S-24Q"]] + DRA_L40S, DRA_L40S)


def test_a_failing_guest_command_fails_naming_the_vmi(cluster, controller, kubeconfig, guest_runner):
    open(guest_runner[0] + ".fail", "w").close()
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, profiles=["L40S-24Q"], guest_command="nvidia-smi",
                                                            guest_runner=guest_runner))
    assert rc == 0, result.get("msg")
    guest = row(result, "health.guest", "L40S-24Q@gpu-a")
    assert guest["status"] == "FAIL"
    assert guest["reason"] == "'nvidia-smi' failed in: vgpu-conformance-l40s-24q-3 (rc 9: NVIDIA-SMI has failed)"


def test_check_mode_creates_nothing_and_lists_what_it_would_create(cluster, kubeconfig, tmp_path):
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, tmp_path), check=True, diff=True)
    assert rc == 0, result.get("msg")
    assert writes(cluster) == []
    assert result["changed"] is True
    assert result["would_create"] == ["Namespace " + NS] + [
        "VirtualMachineInstance %s/%s" % (NS, n) for n in A16_VMIS + [EXTRA["A16-4Q"]] + L40S_VMIS + [EXTRA["L40S-24Q"]]
    ] + ["%s %s/%s" % (kind, NS, n) for n in DRA_A16 + DRA_L40S for kind in ("ResourceClaim", "VirtualMachineInstance")]
    assert result["diff"]["after"]["created"] == result["would_create"]
    for check in ("sharing", "over-allocation", "health.ready", "health.guest"):
        assert [r["reason"] for r in rows(result, check)] == ["check mode: no workload created"] * 2
        assert {r["status"] for r in rows(result, check)} == {"UNKNOWN"}
    for check in ("sharing.dra", "over-allocation.dra"):
        assert [(r["subject"], r["status"], r["reason"]) for r in rows(result, check)] == [
            (subject, "UNKNOWN", "check mode: no claim created") for subject in ("A16-4Q@gpu-b", "L40S-24Q@gpu-a")]
    assert {r["status"] for r in rows(result, "inventory") + rows(result, "accounting")} == {"PASS"}
    assert result["report_files"] == {} and list(tmp_path.iterdir()) == [tmp_path / "kubeconfig"]


def _no_writes_and(cluster, rc, result, message):
    assert rc != 0
    assert result["msg"] == message
    assert "\n" not in result["msg"]
    assert writes(cluster) == []


@pytest.mark.parametrize("args, message", [
    ({"running_timeout": 0}, "running_timeout 0.0: must be a number of seconds greater than 0"),
    ({"pending_timeout": -5}, "pending_timeout -5.0: must be a number of seconds greater than 0"),
    ({"poll_interval": 30, "pending_timeout": 10}, "poll_interval 30.0: must not be longer than the shortest timeout"),
    ({"namespace": "Bad_Name"}, "namespace Bad_Name: not a valid namespace name (DNS-1123 label)"),
    ({"namespace": "default"}, "namespace default exists and is not ours (no accelops.io/vgpu-conformance label): "
                               "pick another namespace"),
    ({"profiles": ["L40S-48Q"]}, "profile L40S-48Q: not a vGPU profile of this cluster (known: A16-4Q, L40S-24Q)"),
    ({"guest_command": "nvidia-smi", "guest_runner": ["no-such-virtctl", "{command}"]},
     "guest_runner no-such-virtctl: command not found on this host"),
    ({"report_dir": "/nonexistent/reports"}, "report_dir /nonexistent/reports: not a directory"),
])
def test_bad_inputs_fail_in_one_line_before_anything_is_created(cluster, kubeconfig, args, message):
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, **args))
    _no_writes_and(cluster, rc, result, message)


def test_forbidden_reads_fail_in_one_line(cluster, kubeconfig):
    cluster.forbid("GET", "nodes")
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig))
    _no_writes_and(cluster, rc, result, 'Nodes: forbidden (HTTP 403): nodes "None" is forbidden: User '
                                        '"system:serviceaccount:test:ansible" cannot get resource "nodes"')


def test_no_kubevirt_cr_fails_in_one_line(cluster, kubeconfig):
    state = healthy_state()
    state["objects"] = [o for o in state["objects"] if o["resource"] != KUBEVIRT]
    cluster.reset(state)
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig))
    _no_writes_and(cluster, rc, result, "KubeVirt */*: no KubeVirt CR found (is KubeVirt installed?)")


def test_no_vgpu_resources_fail_in_one_line(cluster, kubeconfig):
    state = healthy_state(driver=False)
    state["objects"][0]["body"] = kubevirt_cr(pci=[{"pciVendorSelector": "8086:1572", "resourceName": "intel.com/x710"}],
                                              mdev=[])
    cluster.reset(state)
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig))
    _no_writes_and(cluster, rc, result, "KubeVirt kubevirt/kubevirt permits no NVIDIA vGPU resource (pciHostDevices / "
                                        "mediatedDevices) and the DRA driver vgpu.accelops.io publishes none: nothing "
                                        "to attest; publish the vGPUs first (playbooks/cluster.yml)")


def test_a_forbidden_vmi_create_fails_after_deleting_the_namespace(cluster, controller, kubeconfig):
    cluster.forbid("POST", "virtualmachineinstances")
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig))
    assert rc != 0
    assert result["msg"].startswith("VirtualMachineInstance %s/vgpu-conformance-a16-4q-1: forbidden (HTTP 403)" % NS)
    assert result["msg"].endswith("; cleanup deleted 1 object(s)")
    assert writes(cluster) == [("POST", "/api/v1/namespaces"), ("POST", VMI_PATH), ("DELETE", "/api/v1/namespaces/" + NS)]
    assert stored(cluster, NAMESPACES, NS) is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_run_deletes_everything_created(cluster, controller, kubeconfig, sig):
    controller(never_ready=L40S_VMIS)
    proc = start_module(module_args(kubeconfig, profiles=["L40S-24Q"], ready_timeout=60))
    deadline = time.monotonic() + 30
    while stored(cluster, VMIS, L40S_VMIS[-1], NS) is None:
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "no VMI"
        time.sleep(0.1)
    proc.send_signal(sig)
    out = proc.stdout.read()
    proc.wait(timeout=30)
    result = json.loads(out[out.index("{"):])
    assert proc.returncode != 0
    assert result["msg"] == "interrupted by %s; cleanup deleted 5 object(s)" % sig.name
    assert_cleaned_up(cluster, L40S_VMIS)


def test_a_leftover_namespace_of_ours_is_refused_and_state_absent_removes_it(cluster, kubeconfig):
    left = {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NS, "labels": {"accelops.io/vgpu-conformance": "0123abcd"}}}
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "vgpu-conformance-l40s-24q-1", "namespace": NS,
                        "labels": {"accelops.io/vgpu-conformance": "0123abcd"}}}
    state = healthy_state()
    state["objects"] += [{"resource": NAMESPACES, "name": NS, "body": left},
                         {"resource": VMIS, "namespace": NS, "name": vmi["metadata"]["name"], "body": vmi}]
    cluster.reset(state)
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig))
    _no_writes_and(cluster, rc, result, "namespace %s is left from run 0123abcd: delete it first (state=absent)" % NS)

    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, state="absent"), check=True)
    assert (rc, result["changed"], writes(cluster)) == (0, True, [])
    assert result["would_delete"] == ["VirtualMachineInstance %s/vgpu-conformance-l40s-24q-1" % NS, "Namespace " + NS]
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, state="absent"))
    assert (rc, result["changed"]) == (0, True)
    assert writes(cluster) == [("DELETE", "%s/vgpu-conformance-l40s-24q-1" % VMI_PATH), ("DELETE", "/api/v1/namespaces/" + NS)]
    assert stored(cluster, NAMESPACES, NS) is None
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, state="absent"))
    assert (rc, result["changed"]) == (0, False)


def test_state_absent_never_deletes_a_namespace_that_is_not_ours(cluster, kubeconfig):
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, state="absent", namespace="default"))
    _no_writes_and(cluster, rc, result, "namespace default exists and is not ours (no accelops.io/vgpu-conformance "
                                        "label): not deleting it")
