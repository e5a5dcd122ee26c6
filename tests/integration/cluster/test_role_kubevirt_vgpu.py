"""The kubevirt_vgpu role with ansible-playbook against the API server double; fake GPU node hosts
carry `vgpu_profiles_resources` as host vars (the shape the vgpu_profiles role publishes)."""

from __future__ import annotations

import sys

from cluster_helpers import (CLUSTER_POLICY, FOREIGN_MDEV, FOREIGN_NIC, FOREIGN_T4, KUBEVIRT, NODES, default_state,
                             run_playbook)


def resource(profile, pci_id="10DE:26B9", count=2):
    return {"profile": profile, "type_name": "NVIDIA " + profile, "resource_name": "nvidia.com/NVIDIA_" + profile,
            "pci_vendor_selector": pci_id, "framework": "vendor-vfio", "count": count}


def run_role(tmp_path, kubeconfig, nodes, role_vars=None, check=False, via_role_var=False):
    inventory = {"all": {"children": {
        "vgpu_nodes": {"hosts": {name: {"ansible_connection": "local", "vgpu_profiles_resources": res}
                                 for name, res in nodes.items()}},
        "vgpu_cluster": {"hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}}}}}}
    # the connection comes from play-level module_defaults or from the role variable
    role_vars = dict(role_vars or {}, **({"kubevirt_vgpu_kubeconfig": kubeconfig} if via_role_var else {}))
    defaults = {} if via_role_var else {"group/accelops.vgpu.cluster": {"kubeconfig": kubeconfig}}
    play = [{"name": "Publish the vGPU devices", "hosts": "vgpu_cluster[0]", "gather_facts": False,
             "module_defaults": defaults, "roles": [{"role": "accelops.vgpu.kubevirt_vgpu", **role_vars}]}]
    return run_playbook(tmp_path, inventory, play, check)


def test_role_publishes_entries_and_labels_then_is_idempotent(cluster, kubeconfig, tmp_path):
    nodes = {"gpu-a": [resource("L40S-24Q"), resource("H100-40C", "10DE:2331", 1)], "gpu-b": [resource("L40S-24Q")]}
    role_vars = {"kubevirt_vgpu_exclusive": True, "kubevirt_vgpu_manage_cluster_policy": True,
                 "kubevirt_vgpu_vgpu_manager": {"enabled": True, "repository": "registry.example.com/nvidia",
                                                "version": "580.82.02"}}
    proc = run_role(tmp_path, kubeconfig, nodes, role_vars)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    policy = cluster.get(CLUSTER_POLICY, "cluster-policy")["spec"]
    assert policy["sandboxWorkloads"]["enabled"] is True and policy["vgpuDeviceManager"]["enabled"] is False
    assert policy["vgpuManager"]["version"] == "580.82.02"
    pci = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    assert pci == [FOREIGN_NIC, {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S-24Q"},
                   {"pciVendorSelector": "10DE:2331", "resourceName": "nvidia.com/NVIDIA_H100-40C"}]
    assert FOREIGN_T4 not in pci  # exclusive NVIDIA mode
    labels = cluster.get(NODES, "gpu-a")["metadata"]["labels"]
    assert labels["accelops.io/vgpu.profile.L40S-24Q"] == "2" and labels["accelops.io/vgpu.profile.H100-40C"] == "1"
    assert labels["nvidia.com/gpu.workload.config"] == "vm-vgpu" and labels["team"] == "ml"
    assert labels["nvidia.com/gpu.deploy.sandbox-validator"] == "false"
    assert labels["nvidia.com/gpu.deploy.vgpu-device-manager"] == "false"  # one owner for the node's vGPUs

    cluster.clear_log()
    again = run_role(tmp_path, kubeconfig, nodes, role_vars)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout
    assert cluster.writes() == []


def test_two_profiles_of_one_model_on_a_node_fail_before_any_request(cluster, kubeconfig, tmp_path):
    nodes = {"gpu-a": [resource("L40S-24Q", count=1), resource("L40S-48Q", count=1)], "gpu-b": [resource("L40S-24Q")]}
    proc = run_role(tmp_path, kubeconfig, nodes)
    assert proc.returncode != 0
    assert ("node gpu-a: GPU model 10DE:26B9 carries 2 profiles (L40S-24Q, L40S-48Q); KubeVirt cannot tell vGPU "
            "profiles of one PCI ID apart") in proc.stdout, proc.stdout
    assert cluster.log() == []


def test_role_check_mode_writes_nothing(cluster, kubeconfig, tmp_path):
    before = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    proc = run_role(tmp_path, kubeconfig, {"gpu-a": [resource("L40S-24Q")]}, check=True, via_role_var=True)
    assert proc.returncode == 0 and "changed=2" in proc.stdout, proc.stdout
    assert cluster.get(KUBEVIRT, "kubevirt", "kubevirt") == before
    assert all(w["dryRun"] == "All" for w in cluster.writes())


def test_role_migrates_from_a_hand_written_entry_only_when_told(cluster, kubeconfig, tmp_path):
    hand_written = {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/L40S-24Q"}
    state = default_state()
    state["objects"][0]["body"]["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"].append(hand_written)
    cluster.reset(state)
    nodes = {"gpu-a": [resource("L40S-24Q")]}
    refused = run_role(tmp_path, kubeconfig, nodes)
    assert refused.returncode != 0 and cluster.writes() == []
    assert ("pciVendorSelector 10DE:26B9 is permitted as nvidia.com/L40S-24Q and would also be as "
            "nvidia.com/NVIDIA_L40S-24Q") in refused.stdout, refused.stdout
    role_vars = {"kubevirt_vgpu_take_over": ["nvidia.com/L40S-24Q"]}
    migrated = run_role(tmp_path, kubeconfig, nodes, role_vars)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    pci = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    assert pci == [FOREIGN_T4, FOREIGN_NIC, {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S-24Q"}]
    cluster.clear_log()
    again = run_role(tmp_path, kubeconfig, nodes, role_vars)
    assert again.returncode == 0 and "changed=0" in again.stdout and cluster.writes() == [], again.stdout


def permitted(cluster):
    return cluster.get(KUBEVIRT, "kubevirt", "kubevirt")["spec"]["configuration"]["permittedHostDevices"]


def test_provider_agent_permits_a_mixed_profile_fleet_and_switching_shows_in_check_mode(cluster, kubeconfig, tmp_path):
    nodes = {"gpu-a": [resource("L40S-24Q", count=1), resource("L40S-12Q", count=2)], "gpu-b": [resource("L40S-48Q")]}
    assert run_role(tmp_path, kubeconfig, nodes).returncode != 0   # provider kubevirt refuses this fleet
    assert cluster.writes() == []
    before = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")
    agent = {"kubevirt_vgpu_provider": "agent",
             "kubevirt_vgpu_agent_profiles": [{"type_name": "NVIDIA L40S-8Q", "pci_vendor_selector": "10de:26b9"}]}
    check = run_role(tmp_path, kubeconfig, nodes, agent, check=True)
    assert check.returncode == 0 and "changed=" in check.stdout, check.stdout
    assert cluster.get(KUBEVIRT, "kubevirt", "kubevirt") == before and all(w["dryRun"] == "All" for w in cluster.writes())
    proc = run_role(tmp_path, kubeconfig, nodes, agent)
    assert proc.returncode == 0, proc.stdout
    ours = [e for e in permitted(cluster)["pciHostDevices"] if e["resourceName"].startswith("nvidia.com/NVIDIA_L40S")]
    assert ours == [{"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S-" + p,
                     "externalResourceProvider": True} for p in ("24Q", "12Q", "48Q", "8Q")]
    assert FOREIGN_NIC in permitted(cluster)["pciHostDevices"]
    labels = cluster.get(NODES, "gpu-a")["metadata"]["labels"]
    assert labels["accelops.io/vgpu.profile.L40S-24Q"] == "1" and labels["accelops.io/vgpu.profile.L40S-12Q"] == "2"


def test_switching_from_kubevirt_to_agent_turns_our_entry_external_in_place(cluster, kubeconfig, tmp_path):
    nodes = {"gpu-a": [resource("L40S-24Q")]}
    assert run_role(tmp_path, kubeconfig, nodes).returncode == 0
    assert {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S-24Q"} in \
        permitted(cluster)["pciHostDevices"]
    order = [e["resourceName"] for e in permitted(cluster)["pciHostDevices"]]
    proc = run_role(tmp_path, kubeconfig, nodes, {"kubevirt_vgpu_provider": "agent"})
    assert proc.returncode == 0, proc.stdout
    after = permitted(cluster)["pciHostDevices"]
    assert [e["resourceName"] for e in after] == order
    assert {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S-24Q",
            "externalResourceProvider": True} in after
    back = run_role(tmp_path, kubeconfig, nodes)
    assert back.returncode == 0 and {"pciVendorSelector": "10DE:26B9",
                                     "resourceName": "nvidia.com/NVIDIA_L40S-24Q"} in permitted(cluster)["pciHostDevices"]


def mdev_resource(profile, count=4):
    return {"profile": profile, "type_name": "NVIDIA " + profile, "resource_name": "nvidia.com/NVIDIA_" + profile,
            "mdev_name_selector": "NVIDIA " + profile, "framework": "mdev", "count": count}


def test_a_fleet_profile_change_replaces_our_own_entries_and_releases_the_validator_switch(
        cluster, kubeconfig, tmp_path):
    """24Q -> 12Q on every L40S (same PCI ID) through the role, no take_over: the entry the role wrote is
    replaced, the mdev type of the earlier A16 profile goes, foreign entries stay. gpu-a then gets an mdev
    GPU too (no longer all vendor-VFIO): the validator switch the role set goes, a foreign label stays."""
    first = run_role(tmp_path, kubeconfig, {"gpu-a": [resource("L40S-24Q")], "gpu-b": [mdev_resource("A16-4Q")]})
    assert first.returncode == 0, first.stdout + first.stderr
    assert cluster.get(NODES, "gpu-a")["metadata"]["labels"]["nvidia.com/gpu.deploy.sandbox-validator"] == "false"

    changed = run_role(tmp_path, kubeconfig, {"gpu-a": [resource("L40S-12Q"), mdev_resource("A16-8Q")],
                                              "gpu-b": [mdev_resource("A16-8Q")]})
    assert changed.returncode == 0, changed.stdout + changed.stderr
    permitted = cluster.get(KUBEVIRT, "kubevirt", "kubevirt")["spec"]["configuration"]["permittedHostDevices"]
    assert permitted["pciHostDevices"] == [FOREIGN_T4, FOREIGN_NIC,
                                           {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S-12Q"}]
    names = [e["resourceName"] for e in permitted["mediatedDevices"]]
    assert "nvidia.com/NVIDIA_A16-8Q" in names and "nvidia.com/NVIDIA_A16-4Q" not in names
    assert [e for e in permitted["mediatedDevices"] if e["resourceName"] == FOREIGN_MDEV["resourceName"]] == [
        FOREIGN_MDEV]
    labels = cluster.get(NODES, "gpu-a")["metadata"]["labels"]
    assert "nvidia.com/gpu.deploy.sandbox-validator" not in labels and labels["team"] == "ml"
    cluster.clear_log()
    again = run_role(tmp_path, kubeconfig, {"gpu-a": [resource("L40S-12Q"), mdev_resource("A16-8Q")],
                                            "gpu-b": [mdev_resource("A16-8Q")]})
    assert again.returncode == 0 and "changed=0" in again.stdout and cluster.writes() == [], again.stdout
