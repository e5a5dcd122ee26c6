"""The vgpu_node_agent role with ansible-playbook (kubernetes.core.k8s) against the API server double:
what it creates, that a second run writes nothing, that check mode creates nothing, and that the
RBAC it grants is exactly what the agent needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from chart_helpers import CHART_RESOURCES, as_applied, register_chart_kinds, render, stored_objects
from cluster_helpers import CLUSTER_POLICY, COLLECTIONS, KUBEVIRT, NODES, ROOT, default_state

NAMESPACE = "accelops-vgpu"
NAME = "accelops-vgpu-node-agent"
LAYOUTS = {
    "l40s-2x24q": [{"device_filter": "0x26B910DE", "devices": "all", "profiles": {"L40S-24Q": 2}}],
    "l40s-6x8q": [{"device_filter": "0x26B910DE", "devices": "all", "profiles": {"L40S-8Q": 6}}],
}
RESOURCE_24Q = {"profile": "L40S-24Q", "type_name": "NVIDIA L40S-24Q", "resource_name": "nvidia.com/NVIDIA_L40S-24Q",
                "pci_vendor_selector": "10DE:26B9", "framework": "vendor-vfio", "count": 2}
OBJECTS = CHART_RESOURCES


@pytest.fixture
def cluster(api_server):
    api_server.reset(register_chart_kinds(default_state()))  # KubeVirt CR, ClusterPolicy, Nodes gpu-a (team=ml), gpu-b
    return api_server


def run_role(tmp_path, kubeconfig, role_vars=None, check=False, diff=False, playbook=None):
    """The role in a play of its own, or `playbook` (a path) with role_vars as extra vars."""
    nodes = {"gpu-a.example.com": {"kubevirt_vgpu_node_name": "gpu-a", "vgpu_profiles_selected": "l40s-2x24q"},
             "gpu-b": {"vgpu_profiles_selected": "l40s-6x8q"}}
    resource_8q = dict(RESOURCE_24Q, profile="L40S-8Q", count=6, type_name="NVIDIA L40S-8Q",
                       resource_name="nvidia.com/NVIDIA_L40S-8Q")
    resources = {"gpu-a.example.com": RESOURCE_24Q, "gpu-b": resource_8q}
    for name, host in nodes.items():  # what nodes.yml publishes, for the kubevirt_vgpu play of cluster.yml
        host["vgpu_profiles_resources"] = [resources[name]]
    inventory = {"all": {"children": {
        "vgpu_nodes": {"hosts": nodes, "vars": {"vgpu_profiles_configs": LAYOUTS, "ansible_connection": "local"}},
        "vgpu_cluster": {"hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}}}}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    role_vars = dict({"vgpu_node_agent_kubeconfig": kubeconfig, "vgpu_node_agent_image_registry": "registry.example.com",
                      "vgpu_node_agent_image_tag": "1.0"}, **(role_vars or {}))
    play = [{"name": "Deploy the node agent", "hosts": "vgpu_cluster[0]", "gather_facts": False,
             "roles": [{"role": "accelops.vgpu.vgpu_node_agent", **role_vars}]}]
    (tmp_path / "play.json").write_text(json.dumps(play))
    (tmp_path / "vars.json").write_text(json.dumps(role_vars))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
               ANSIBLE_HOME=str(tmp_path / "ansible-home"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="default",
               PATH=str(ROOT / ".venv" / "bin") + os.pathsep + os.environ.get("PATH", ""))  # helm (make setup)
    target = [str(playbook), "--extra-vars", "@" + str(tmp_path / "vars.json")] if playbook else [str(tmp_path / "play.json")]
    argv = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(tmp_path / "inventory.json")] + target \
        + (["--check"] if check else []) + (["--diff"] if diff else [])
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)


def agent_objects(cluster):
    return stored_objects(cluster)


def test_deploys_the_agent_labels_the_nodes_and_is_idempotent(cluster, kubeconfig, tmp_path):
    proc = run_role(tmp_path, kubeconfig)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    objects = agent_objects(cluster)
    assert sorted(objects) == sorted(kind for kind, _ns in OBJECTS.values())

    config = json.loads(objects["ConfigMap"]["data"]["config.json"])
    assert config == {"version": "v1", "vgpu-configs": {
        label: [{"device-filter": e["device_filter"], "devices": "all", "vgpu-devices": e["profiles"]} for e in entries]
        for label, entries in LAYOUTS.items()}}

    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == NAME and pod["nodeSelector"] == {"nvidia.com/gpu.workload.config": "vm-vgpu"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert not any(pod.get(key) for key in ("hostPID", "hostNetwork", "hostIPC"))
    container = pod["containers"][0]
    assert container["image"] == "registry.example.com/accelops/vgpu-node-agent:1.0"
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["CONFIG_FILE"] == "/etc/accelops-vgpu/agent/config.json" and env["DEFAULT_VGPU_CONFIG"] == "l40s-2x24q"
    assert env["HOST_ROOT_MOUNT"] == "/host" and env["MIXED_SIZE"] == "false"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/host/dev"]["readOnly"] and mounts["/host/proc"]["readOnly"] and not mounts["/host/sys"].get("readOnly")
    assert mounts["/etc/accelops-vgpu/agent"]["readOnly"] and "/run/accelops-vgpu" in mounts
    host_paths = sorted(v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v)
    # the allocation record and PodResources in every mode: the record is pruned whenever one exists
    assert host_paths == ["/dev", "/etc/accelops-vgpu", "/proc", "/run/accelops-vgpu", "/sys",
                          "/var/lib/kubelet/plugins/accelops-vgpu-device-plugin", "/var/lib/kubelet/pod-resources"]
    assert "/host/etc/accelops-vgpu" in mounts   # the hand-over to the boot unit (node/boot/handover.py)
    assert container["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True}

    labels = {n: cluster.get(NODES, n)["metadata"]["labels"] for n in ("gpu-a", "gpu-b")}
    assert labels["gpu-a"]["nvidia.com/vgpu.config"] == "l40s-2x24q" and labels["gpu-a"]["team"] == "ml"
    assert labels["gpu-b"]["nvidia.com/vgpu.config"] == "l40s-6x8q"
    assert labels["gpu-b"]["nvidia.com/gpu.workload.config"] == "vm-vgpu"
    assert cluster.get(CLUSTER_POLICY, "cluster-policy")["spec"]["vgpuDeviceManager"]["enabled"] is False

    before = agent_objects(cluster), {n: cluster.get(NODES, n) for n in ("gpu-a", "gpu-b")}
    cluster.clear_log()
    again = run_role(tmp_path, kubeconfig)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout
    assert not [w for w in cluster.writes() if w["method"] in ("POST", "DELETE")]
    assert (agent_objects(cluster), {n: cluster.get(NODES, n) for n in ("gpu-a", "gpu-b")}) == before


def test_the_role_applies_what_helm_template_renders_from_the_layout_schema(cluster, kubeconfig, tmp_path):
    """One source: the objects the role applied are, field for field, `helm template` of the chart with the
    equivalent chart values, the layouts given in the vgpu_profiles schema (the chart's own conversion)."""
    assert run_role(tmp_path, kubeconfig).returncode == 0
    values = {"createNamespace": True, "managedBy": "accelops.vgpu", "configs": LAYOUTS, "defaultConfig": "l40s-2x24q",
              "image": {"registry": "registry.example.com", "tag": "1.0"}}
    (tmp_path / "values.json").write_text(json.dumps(values))
    rendered = {obj["kind"]: obj for obj in render("--values", tmp_path / "values.json")}
    applied = agent_objects(cluster)
    assert sorted(applied) == sorted(rendered)
    for kind, obj in rendered.items():
        assert as_applied(applied[kind]) == obj, kind


def test_rbac_is_exactly_what_the_agent_needs(cluster, kubeconfig, tmp_path):
    assert run_role(tmp_path, kubeconfig).returncode == 0
    objects = agent_objects(cluster)
    assert objects["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}]
    assert objects["Role"]["metadata"]["namespace"] == NAMESPACE
    assert objects["Role"]["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    for binding, role in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        assert objects[binding]["subjects"] == subject
        assert objects[binding]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role, "name": NAME}


def test_check_mode_creates_nothing(cluster, kubeconfig, tmp_path):
    nodes_before = {n: cluster.get(NODES, n) for n in ("gpu-a", "gpu-b")}
    proc = run_role(tmp_path, kubeconfig, check=True, diff=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "changed=" in proc.stdout and "changed=0" not in proc.stdout
    writes = cluster.writes()
    assert writes and all(w["dryRun"] == "All" for w in writes), writes
    assert agent_objects(cluster) == {}
    assert {n: cluster.get(NODES, n) for n in ("gpu-a", "gpu-b")} == nodes_before


def test_a_node_with_an_unknown_layout_fails_before_any_request(cluster, kubeconfig, tmp_path):
    proc = run_role(tmp_path, kubeconfig, {"vgpu_node_agent_configs": {"l40s-2x24q": LAYOUTS["l40s-2x24q"]}})
    assert proc.returncode != 0 and "unknown: ['gpu-b']" in proc.stdout, proc.stdout
    assert cluster.log() == []


def test_absent_removes_the_objects_and_the_layout_labels(cluster, kubeconfig, tmp_path):
    assert run_role(tmp_path, kubeconfig).returncode == 0
    proc = run_role(tmp_path, kubeconfig, {"vgpu_node_agent_state": "absent"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert agent_objects(cluster) == {}
    labels = cluster.get(NODES, "gpu-a")["metadata"]["labels"]
    assert "nvidia.com/vgpu.config" not in labels and labels["team"] == "ml"


def test_cluster_playbook_agent_path_deploys_the_agent_then_publishes_per_model(cluster, kubeconfig, tmp_path):
    """playbooks/cluster.yml with vgpu_cluster_node_agent: the agent and the node labels, then KubeVirt with one
    resource per GPU model (the profile may change by relabel) and no profile labels from the bastion facts."""
    proc = run_role(tmp_path, kubeconfig, {"vgpu_cluster_node_agent": True, "kubevirt_vgpu_kubeconfig": kubeconfig,
                                           "kubevirt_vgpu_resource_naming": "model",
                                           "kubevirt_vgpu_manage_node_labels": False},
                    playbook=ROOT / "playbooks" / "cluster.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(agent_objects(cluster)) == sorted(kind for kind, _ns in OBJECTS.values())
    assert cluster.get(NODES, "gpu-b")["metadata"]["labels"]["nvidia.com/vgpu.config"] == "l40s-6x8q"
    assert not any(k.startswith("accelops.io/vgpu.profile.") for k in cluster.get(NODES, "gpu-a")["metadata"]["labels"])
    pci = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    assert {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S"} in pci


def test_cluster_playbook_without_the_agent_path_deploys_no_agent(cluster, kubeconfig, tmp_path):
    proc = run_role(tmp_path, kubeconfig, {"kubevirt_vgpu_kubeconfig": kubeconfig,
                                           "kubevirt_vgpu_resource_naming": "model"},
                    playbook=ROOT / "playbooks" / "cluster.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert agent_objects(cluster) == {}
    assert "nvidia.com/vgpu.config" not in cluster.get(NODES, "gpu-a")["metadata"]["labels"]


def test_cluster_playbook_with_the_agents_device_plugin_permits_every_profile_of_one_model(
        cluster, kubeconfig, tmp_path):
    """The agent serves the kubelet (its DaemonSet mounts device-plugins/), KubeVirt only permits: one external
    entry per profile, 24Q on gpu-a and 8Q on gpu-b though both are L40S."""
    proc = run_role(tmp_path, kubeconfig, {"vgpu_cluster_node_agent": True, "kubevirt_vgpu_kubeconfig": kubeconfig,
                                           "vgpu_node_agent_device_plugin": True,
                                           "vgpu_node_agent_kubelet_dir": "/var/lib/k0s/kubelet",
                                           "kubevirt_vgpu_provider": "agent"},
                    playbook=ROOT / "playbooks" / "cluster.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pod = agent_objects(cluster)["DaemonSet"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    # the host's kubelet directory at the same path in the container (the DRA driver registers host paths too)
    assert env["DEVICE_PLUGIN"] == "true" and env["KUBELET_DIR"] == "/var/lib/k0s/kubelet"
    assert {"name": "device-plugins", "mountPath": "/var/lib/k0s/kubelet/device-plugins"} in \
        pod["containers"][0]["volumeMounts"]
    assert {"name": "device-plugins", "hostPath": {"path": "/var/lib/k0s/kubelet/device-plugins", "type": "Directory"}} \
        in pod["volumes"]
    pci = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    for profile in ("L40S-24Q", "L40S-8Q"):
        assert {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_" + profile,
                "externalResourceProvider": True} in pci


def test_the_dra_driver_switch_creates_the_device_classes_rbac_and_mounts(api_server, kubeconfig, tmp_path):
    state = register_chart_kinds(default_state())
    state["resources"]["resource.k8s.io/v1/deviceclasses"] = {"kind": "DeviceClass", "singular": "deviceclass",
                                                              "namespaced": False, "verbs": ["get", "create", "patch"]}
    api_server.reset(state)
    proc = run_role(tmp_path, kubeconfig, {"vgpu_node_agent_dra": True, "vgpu_node_agent_cdi_dir": "/etc/cdi",
                                           "vgpu_node_agent_kubelet_dir": "/var/lib/k0s/kubelet"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    classes = [api_server.get("resource.k8s.io/v1/deviceclasses", name)["spec"]["selectors"][0]["cel"]["expression"]
               for name in ("vgpu.accelops.io", "vendor-vfio.vgpu.accelops.io", "mdev.vgpu.accelops.io")]
    assert classes[0] == 'device.driver == "vgpu.accelops.io"' and 'framework == "mdev"' in classes[2]
    rules = api_server.get("rbac.authorization.k8s.io/v1/clusterroles", NAME)["rules"]
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list"]} in rules
    pod = api_server.get("apps/v1/daemonsets", NAME, NAMESPACE)["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert (env["DRA_DRIVER"], env["CDI_DIR"], env["KUBELET_DIR"]) == ("true", "/etc/cdi", "/var/lib/k0s/kubelet")


def test_device_plugin_and_dra_on_the_same_gpus_fail_before_any_request(cluster, kubeconfig, tmp_path):
    # issue 31.5: both on offered every vGPU twice (an extended resource and a DRA device)
    both = {"vgpu_node_agent_device_plugin": True, "vgpu_node_agent_dra": True}
    proc = run_role(tmp_path, kubeconfig, both)
    assert proc.returncode != 0 and "together offer every vGPU twice" in proc.stdout, proc.stdout
    proc = run_role(tmp_path, kubeconfig, dict(both, vgpu_node_agent_device_plugin_gpus=["10de:26b9"],
                                               vgpu_node_agent_dra_gpus=["10DE:26B9"]))
    assert proc.returncode != 0 and "in both: ['10de:26b9']" in proc.stdout, proc.stdout
    assert cluster.log() == []


def test_device_plugin_and_dra_on_disjoint_gpus_reach_the_agent(api_server, kubeconfig, tmp_path):
    state = register_chart_kinds(default_state())
    state["resources"]["resource.k8s.io/v1/deviceclasses"] = {"kind": "DeviceClass", "singular": "deviceclass",
                                                              "namespaced": False, "verbs": ["get", "create", "patch"]}
    api_server.reset(state)
    proc = run_role(tmp_path, kubeconfig, {"vgpu_node_agent_device_plugin": True, "vgpu_node_agent_dra": True,
                                           "vgpu_node_agent_device_plugin_gpus": ["10de:26b9"],
                                           "vgpu_node_agent_dra_gpus": ["0000:c1:00.0", "0x25B610DE"]})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pod = api_server.get("apps/v1/daemonsets", NAME, NAMESPACE)["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert (env["DEVICE_PLUGIN"], env["DEVICE_PLUGIN_GPUS"]) == ("true", "10de:26b9")
    assert (env["DRA_DRIVER"], env["DRA_DRIVER_GPUS"]) == ("true", "0000:c1:00.0,0x25B610DE")
