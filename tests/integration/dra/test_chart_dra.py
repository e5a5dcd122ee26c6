"""The agent chart with dra.enabled: RBAC is exactly what the driver's client does, the kubelet and CDI paths are
mounted where the host has them, and every object is valid for Kubernetes 1.34-1.37 (resource.k8s.io/v1)."""

from __future__ import annotations

import subprocess

import kubernetes_validate
import pytest
import yaml

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DRIVER, NodeView
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimRef
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.publisher import SlicePublisher
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ROOT
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import (
    NODE, NODE_UID, client, program, read_facts, sysfs_devices)

CHART = ROOT / "charts" / "accelops-vgpu-node-agent"
VERBS = {"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}


def render(*sets):
    argv = [str(ROOT / ".venv" / "bin" / "helm"), "template", "agent", str(CHART), "--values",
            str(CHART / "ci" / "example-values.yaml")]
    for item in sets:
        argv += ["--set", item]
    text = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout
    return [obj for obj in yaml.safe_load_all(text) if obj]


def of_kind(objects, kind):
    return [obj for obj in objects if obj["kind"] == kind]


def resource_rules(objects):
    [role] = of_kind(objects, "ClusterRole")
    return {(resource, verb) for rule in role["rules"] if rule["apiGroups"] == ["resource.k8s.io"]
            for resource in rule["resources"] for verb in rule["verbs"]}


@pytest.mark.parametrize("version", ("1.34.0", "1.35.0", "1.36.0", "1.37.0"))
def test_every_object_with_dra_is_valid(version):
    # both modes on: each GPU to exactly one of them (the chart refuses the same GPUs for both)
    for obj in render("dra.enabled=true", "devicePlugin.enabled=true", "devicePlugin.gpus[0]=0000:41:00.0",
                      "dra.gpus[0]=0000:42:00.0"):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("modes", (["devicePlugin.enabled=true"], ["dra.enabled=true"], []))
def test_pod_resources_read_only_and_the_allocation_record_are_mounted_whatever_modes_are_on(modes):
    """The device plugin writes the record; with it off (DRA only, none) the agent still prunes a record an earlier
    device plugin left and its applies still read it (agent._prune_allocations, node/holders/kubelet_holders.py)."""
    objects = render("kubeletDir=/var/lib/k0s/kubelet", *modes)
    [daemonset] = of_kind(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert host["pod-resources"] == mounts["pod-resources"]["mountPath"] == "/var/lib/k0s/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"] is True
    assert host["device-plugin-record"] == mounts["device-plugin-record"]["mountPath"] == \
        "/var/lib/k0s/kubelet/plugins/accelops-vgpu-device-plugin"      # node/holders/pod_allocations.record_path
    assert ("device-plugins" in host) == ("devicePlugin.enabled=true" in modes)


def test_without_dra_nothing_of_resource_k8s_io():
    objects = render()
    assert not of_kind(objects, "DeviceClass") and resource_rules(objects) == set()


def test_kubelet_and_cdi_directories_are_mounted_at_the_host_paths():
    objects = render("dra.enabled=true", "kubeletDir=/var/lib/k0s/kubelet", "dra.cdiDir=/etc/cdi")
    [daemonset] = of_kind(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["DRA_DRIVER"], env["KUBELET_DIR"], env["CDI_DIR"]) == ("true", "/var/lib/k0s/kubelet", "/etc/cdi")
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for name in ("plugins-registry", "dra-plugin", "cdi"):
        assert mounts[name] == host[name]       # the kubelet dials, and the runtime reads, the paths the agent writes
    assert host["dra-plugin"] == "/var/lib/k0s/kubelet/plugins/vgpu.accelops.io"
    assert sorted(c["metadata"]["name"] for c in of_kind(objects, "DeviceClass")) == [
        "mdev.vgpu.accelops.io", "vendor-vfio.vgpu.accelops.io", "vgpu.accelops.io"]


def test_rbac_is_exactly_what_the_driver_does(gpusim_node, dra_api, tmp_path):
    """Publish, change, withdraw slices, read a claim and list the claims (agent_plugin: a device or the old pool
    name still in use) through the real client; the verbs the API double saw on resource.k8s.io are the chart's
    rules, no more, no less."""
    gpu_node = gpusim_node("l40s:1")
    program(gpu_node, [1155], per_pf=2)
    api = client(dra_api, tmp_path)
    dra_api.clear_log()
    publisher = SlicePublisher(api, NODE, NODE_UID)
    publisher.publish(sysfs_devices(gpu_node, tmp_path))
    gpu_node.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % gpu_node.vfs(gpu_node.pfs()[0])[1], 0)
    publisher.publish(sysfs_devices(gpu_node, tmp_path))
    publisher.withdraw()
    assert list(api.watch_resource_slices(NODE, DRIVER, None, 1)) == []     # the SliceKeeper's watch (none left)
    driver = DraDriver(NODE, api.get_resource_claim, NodeView(None, read_facts(gpu_node, tmp_path)),
                       str(tmp_path / "plugin"), str(tmp_path / "cdi"))
    driver.prepare([ClaimRef("vms", "absent", "u-1")])
    assert api.list_resource_claims() == []
    used = set()
    for entry in dra_api.log():
        parts = entry["path"].split("/")
        if parts[1:3] == ["apis", "resource.k8s.io"]:
            resource = "resourceslices" if "resourceslices" in parts else "resourceclaims"
            named = parts[-2] == resource
            verb = "watch" if entry.get("watch") else "list"
            used.add((resource, VERBS[entry["method"]] if named or entry["method"] != "GET" else verb))
    assert used == resource_rules(render("dra.enabled=true"))
    assert claim_holders.holders_of(str(tmp_path / "plugin")) == {}
