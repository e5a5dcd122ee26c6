"""The agent serving its vGPUs to the kubelet: the agent as a real process (the zipapp on the node's Python with
Debian's grpcio), the test kubelet double over the device plugin API, the API server double's Node status."""

from __future__ import annotations

import copy
import os
import signal

import grpc
import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pod_allocations
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import RESOURCES, wait_for
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import (
    RESOURCES as DRA_RESOURCES, dra_state, published_devices)
from ansible_collections.accelops.vgpu.tests.integration.pod_allocations import allocate_to_pod

R24, R12 = "nvidia.com/NVIDIA_L40S-24Q", "nvidia.com/NVIDIA_L40S-12Q"
ENV24 = "PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-24Q"


def start_plugin_agent(start_agent, gpu_node, cluster, kubelet, **env):
    return start_agent(gpu_node, cluster.api, **dict(dict(DEVICE_PLUGIN="true", KUBELET_DIR=kubelet.root,
                                                          RESYNC_INTERVAL="1"), **env))


def serving(agent, kubelet, count):
    """`agent` once it applied the default layout and the kubelet has its `count` 24Q vGPUs."""
    agent.wait("success", "default")
    kubelet.wait("registered", lambda k: len(ids(k, R24)) == count)
    return agent


def ids(kubelet, resource, health="Healthy"):
    return sorted(i for i, h, dummy in kubelet.devices(resource) if h == health)


def typed_vfs(node):
    """{VF: current_vgpu_type} of every VF with a type, read from the simulated sysfs."""
    types = {}
    for pf in node.pfs():
        for vf in node.vfs(pf):
            type_id = node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf)
            if type_id != "0":
                types[vf] = type_id
    return types


def node_status(cluster):
    status = cluster.node().get("status") or {}
    return status.get("capacity") or {}, status.get("allocatable") or {}


def test_the_kubelet_gets_one_resource_per_profile_with_the_vfs_sysfs_shows(
        gpusim_node, cluster, start_agent, kubelet):
    node = gpusim_node("l40s:2")
    agent = start_plugin_agent(start_agent, node, cluster, kubelet)
    agent.wait("success", "default")
    kubelet.wait("4 healthy 24Q vGPUs", lambda k: len(ids(k, R24)) == 4)
    typed = sorted(typed_vfs(node))
    assert ids(kubelet, R24) == typed and list(kubelet.devices()) == [R24]
    numa = dict((i, n) for i, h, n in kubelet.devices(R24))
    assert numa == dict((vf, [int(node.read("bus/pci/devices/%s/numa_node" % vf))]) for vf in typed)
    wait_for("node status from the kubelet", lambda: node_status(cluster) == ({R24: "4"}, {R24: "4"}))

    response = kubelet.allocate(R24, typed[:2])
    assert dict(response.envs) == {ENV24: ",".join(typed[:2])}
    paths = [d.host_path for d in response.devices]
    assert paths[0] == "/dev/vfio/vfio" and all(d.permissions == "mrw" for d in response.devices)
    for vf in typed[:2]:
        group = os.path.basename(os.readlink(node.path("bus/pci/devices", vf, "iommu_group")))
        assert "/dev/vfio/" + group in paths
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(R24, ["0000:99:00.1"])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "0000:99:00.1" in refused.value.details()
    assert dict(kubelet.allocate(R24, typed[2:3]).envs) == {ENV24: typed[2]}   # still serving


def test_after_a_relabel_the_resources_follow_and_the_old_one_goes(gpusim_node, cluster, start_agent, kubelet):
    node = gpusim_node("l40s:2")
    agent = start_plugin_agent(start_agent, node, cluster, kubelet, MIXED_SIZE="true")
    agent.wait("success", "default")
    kubelet.wait("24Q", lambda k: len(ids(k, R24)) == 4)
    served, seen = ids(kubelet, R24), len(kubelet.updates)
    agent.forget_status()
    cluster.select("L40S-12Q")
    agent.wait("success", "L40S-12Q")
    kubelet.wait("8 x 12Q, 24Q gone", lambda k: len(ids(k, R12)) == 8 and R24 not in k.devices())
    # issue 40.6: the 24Q vGPUs the relabel retypes were served Unhealthy before its first write
    assert (R24, [(i, "Unhealthy") for i in served]) in kubelet.updates[seen:], kubelet.updates[seen:]
    wait_for("node status follows", lambda: node_status(cluster) == ({R12: "8"}, {R12: "8"}))
    agent.forget_status()
    cluster.select("first-gpu-mixed")
    agent.wait("success", "first-gpu-mixed")
    # the layout names GPU 0 only: its vGPUs are served (GPU 1 keeps its types, unmanaged, as VDM leaves it)
    types = dict((vf, t) for vf, t in typed_vfs(node).items() if vf in node.vfs(node.pfs()[0]))
    kubelet.wait("one GPU mixed, one model, two profiles: the devices sysfs shows",
                 lambda k: sorted(ids(k, R24) + ids(k, R12)) == sorted(types) and len(ids(k, R24)) == 1)
    assert len(set(types[vf] for vf in ids(kubelet, R12))) == 1 and types[ids(kubelet, R24)[0]] not in [
        types[vf] for vf in ids(kubelet, R12)]


def test_a_manager_restart_shows_unhealthy_then_healthy_once_reapplied(gpusim_node, cluster, start_agent, kubelet):
    node = gpusim_node("l40s:1")
    agent = start_plugin_agent(start_agent, node, cluster, kubelet)
    agent.wait("success", "default")
    kubelet.wait("healthy", lambda k: len(ids(k, R24)) == 2)
    served = ids(kubelet, R24)
    seen = len(kubelet.updates)
    node.ctl("reboot")                          # the vGPU manager restarts: VFs and types reset
    kubelet.wait("unhealthy, then healthy again", lambda k: any(
        u == (R24, [(i, "Unhealthy") for i in served]) for u in k.updates[seen:]) and ids(k, R24) == served)
    assert "is Unhealthy" in agent.output()


def test_a_kubelet_restart_gets_the_resources_registered_again(gpusim_node, cluster, start_agent, kubelet):
    node = gpusim_node("l40s:1")
    agent = start_plugin_agent(start_agent, node, cluster, kubelet)
    agent.wait("success", "default")
    kubelet.wait("registered", lambda k: len(ids(k, R24)) == 2)
    calls = len(kubelet.register_calls)
    kubelet.restart()
    kubelet.wait("registered again", lambda k: len(k.register_calls) > calls and len(ids(k, R24)) == 2)
    assert dict(kubelet.allocate(R24, ids(kubelet, R24)[:1]).envs) == {ENV24: ids(kubelet, R24)[0]}


def test_a_vgpu_a_vm_holds_stays_listed_and_healthy(gpusim_node, cluster, start_agent, kubelet):
    node = gpusim_node("l40s:1")
    agent = start_plugin_agent(start_agent, node, cluster, kubelet)
    agent.wait("success", "default")
    kubelet.wait("registered", lambda k: len(ids(k, R24)) == 2)
    held = ids(kubelet, R24)[0]
    node.hold(held)
    agent.forget_status()
    cluster.select("L40S-12Q")                  # refused: a VM holds a VF of this GPU
    agent.wait("failed", "L40S-12Q")
    assert ids(kubelet, R24) == sorted(i for i, h, n in kubelet.devices(R24)) and held in ids(kubelet, R24)
    assert node_status(cluster)[1] == {R24: "2"}


def test_a_vgpu_allocated_to_a_pod_is_not_retyped_until_the_pod_is_gone(gpusim_node, cluster, start_agent, kubelet):
    """Allocate answered, the VM not started (image pull): no process holds the VF, the record does. Once the pod is
    gone, and once a VM holding a VF is deleted, the refused layout converges within seconds (issue 40.5b), not at
    the resync (300 s here). KUBELET_RESTART_GRACE: the test kubelet started moments ago, which is a restart."""
    node = gpusim_node("l40s:1")
    agent = start_plugin_agent(start_agent, node, cluster, kubelet, RESYNC_INTERVAL="300", KUBELET_RESTART_GRACE="1",
                               MIXED_SIZE="true")
    agent.wait("success", "default")
    kubelet.wait("registered", lambda k: len(ids(k, R24)) == 2)
    allocated = ids(kubelet, R24)[0]
    kubelet.run_pod("vms", "virt-launcher-vm-a", R24, [allocated])
    node.clear_log()
    agent.forget_status()
    cluster.select("L40S-12Q")
    status = agent.wait("failed", "L40S-12Q")
    assert allocated in status["reason"] and "pod vms/virt-launcher-vm-a" in status["reason"], status
    assert node.log() == [] and typed_vfs(node)[allocated] == "1155"
    agent.forget_status()
    kubelet.delete_pod("vms", "virt-launcher-vm-a")    # the pod is gone: free at the next check
    agent.wait("success", "L40S-12Q", timeout=15)
    kubelet.wait("12Q served", lambda k: len(ids(k, R12)) == 4)
    held = ids(kubelet, R12)[0]
    node.hold(held)                                    # a VM runs on a 12Q ...
    agent.forget_status()
    cluster.select("default")                          # ... so the relabel back is refused
    agent.wait("failed", "default")
    node.release(held)                                 # the VM deleted: its VFIO group closed
    agent.wait("success", "default", timeout=15)
    assert "no longer held; reconciling" in agent.output()


def test_podresources_unreachable_keeps_an_allocated_vgpu_held(gpusim_node, cluster, start_agent, kubelet):
    node = gpusim_node("l40s:1")
    # KUBELET_RESTART_GRACE: the test kubelet started moments ago, which is a restart (every vGPU held for the grace)
    agent = start_plugin_agent(start_agent, node, cluster, kubelet, KUBELET_RESTART_GRACE="1")
    agent.wait("success", "default")
    kubelet.wait("registered", lambda k: len(ids(k, R24)) == 2)
    allocated = ids(kubelet, R24)[1]
    pod = allocate_to_pod(kubelet.root, allocated, pod=None)   # allocated long ago, never listed by the kubelet
    kubelet.pod_resources.unavailable = True
    node.clear_log()
    agent.forget_status()
    cluster.select("L40S-12Q")
    status = agent.wait("failed", "L40S-12Q")
    assert allocated in status["reason"] and pod in status["reason"], status
    assert node.log() == [] and "the vGPUs it allocated stay held" in agent.output()
    agent.forget_status()
    kubelet.pod_resources.unavailable = False          # the kubelet answers: no live pod holds it
    agent.wait("success", "L40S-12Q")


def test_an_agent_restarted_under_a_refused_layout_serves_what_the_node_has_programmed(
        gpusim_node, cluster, start_agent, kubelet):
    # issue 31.4: a rolled DaemonSet on a node whose relabel is refused (a VM holds a VF) kept the kubelet without
    # the vGPUs: devices were served only after a successful apply
    node = gpusim_node("l40s:2")
    agent = serving(start_plugin_agent(start_agent, node, cluster, kubelet), kubelet, 4)
    programmed = sorted(typed_vfs(node))
    node.hold(programmed[0])
    agent.proc.send_signal(signal.SIGTERM)      # the DaemonSet rolls: the old pod goes ...
    assert agent.proc.wait(timeout=30) == 0
    kubelet.wait("the capacity dropped", lambda k: not k.devices())
    cluster.select("L40S-12Q")                  # ... a relabel it cannot converge (a VM holds a VF of GPU 0)
    writes = len(node.writes())
    agent = start_plugin_agent(start_agent, node, cluster, kubelet)   # ... and the new pod starts
    agent.wait("failed", "L40S-12Q")
    kubelet.wait("the programmed vGPUs served again, Healthy", lambda k: ids(k, R24) == programmed)
    assert list(kubelet.devices()) == [R24] and ids(kubelet, R24, "Unhealthy") == []
    assert sorted(typed_vfs(node)) == programmed and len(node.writes()) == writes   # nothing written
    wait_for("node status from the kubelet", lambda: node_status(cluster) == ({R24: "4"}, {R24: "4"}))
    # a VF the vGPU manager lost (its type reset) is served Unhealthy by the next reconcile's check
    node.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % programmed[-1], "0")
    kubelet.wait("the untyped VF Unhealthy", lambda k: ids(k, R24, "Unhealthy") == programmed[-1:])


def test_sigterm_removes_the_sockets_and_the_kubelet_drops_the_vgpus(gpusim_node, cluster, start_agent, kubelet):
    node = gpusim_node("l40s:1")
    agent = start_plugin_agent(start_agent, node, cluster, kubelet)
    agent.wait("success", "default")
    kubelet.wait("registered", lambda k: len(ids(k, R24)) == 2)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=30) == 0
    assert os.listdir(os.path.join(kubelet.root, "device-plugins")) == ["kubelet.sock"]
    kubelet.wait("unhealthy, then gone", lambda k: not k.devices())
    wait_for("node status emptied", lambda: node_status(cluster) == ({}, {}))


def test_a_kubelet_dir_without_device_plugins_is_one_line_and_exit_2(gpusim_node, cluster, start_agent, tmp_path):
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, DEVICE_PLUGIN="true", KUBELET_DIR=str(tmp_path))
    assert agent.proc.wait(timeout=30) == 2
    assert agent.output().strip().splitlines()[-1].endswith(
        "kubelet directory %s: no device-plugins/ directory (KUBELET_DIR or --kubelet-dir names the kubelet's root "
        "directory, e.g. /var/lib/k0s/kubelet on k0s)" % tmp_path)


def test_device_plugin_and_dra_serve_disjoint_gpus_and_never_the_same_one(
        gpusim_node, cluster, start_agent, kubelet, tmp_path):
    # issue 31.5: both on offered every vGPU twice (an extended resource and a DRA device)
    node = gpusim_node("l40s:2")
    first, second = node.pfs()
    state = dra_state()
    state["resources"] = dict(copy.deepcopy(RESOURCES), **DRA_RESOURCES)
    cluster.api.reset(state)
    both = {"DRA_DRIVER": "true", "CDI_DIR": str(tmp_path / "cdi")}
    refused = start_plugin_agent(start_agent, node, cluster, kubelet, **both)
    assert refused.proc.wait(timeout=30) == 2
    assert refused.output().strip().splitlines()[-1].endswith("DEVICE_PLUGIN=true and DRA_DRIVER=true offer every "
                                                              "vGPU twice (an extended resource and a DRA device, so "
                                                              "two pods get the same VF): enable one of them, or give "
                                                              "each GPU to exactly one with DEVICE_PLUGIN_GPUS and "
                                                              "DRA_DRIVER_GPUS (disjoint)")
    refused = start_plugin_agent(start_agent, node, cluster, kubelet, DEVICE_PLUGIN_GPUS=first,
                                 DRA_DRIVER_GPUS="10de:26b9", **both)   # the L40S's PCI ID takes the first GPU too
    assert refused.proc.wait(timeout=30) == 2
    assert ("GPU %s (10de:26b9) is in both DEVICE_PLUGIN_GPUS and DRA_DRIVER_GPUS" % first) in refused.output()
    assert kubelet.devices() == {} and published_devices(cluster.api) == {}

    agent = start_plugin_agent(start_agent, node, cluster, kubelet, DEVICE_PLUGIN_GPUS=first, DRA_DRIVER_GPUS=second,
                               **both)
    agent.wait("success", "default")
    vfs = typed_vfs(node)
    kubelet.wait("the first GPU's vGPUs", lambda k: ids(k, R24) == sorted(vf for vf in vfs if vf in node.vfs(first)))
    wait_for("the second GPU's vGPUs published", lambda: len(published_devices(cluster.api)) == 2)
    published = sorted(d["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
                       for d in published_devices(cluster.api).values())
    assert published == sorted(vf for vf in vfs if vf in node.vfs(second))
    assert not set(published) & set(ids(kubelet, R24)) and sorted(published + ids(kubelet, R24)) == sorted(vfs)
    wait_for("node status: one GPU's vGPUs", lambda: node_status(cluster) == ({R24: "2"}, {R24: "2"}))


def test_with_the_device_plugin_off_a_record_left_behind_is_still_pruned(gpusim_node, cluster, start_agent, kubelet):
    """A GPU switched from the device plugin to DRA (or a DRA-only node) keeps the record an earlier device plugin
    wrote: the agent still prunes it against PodResources at every reconcile, so an allocation whose pod never
    came holds no VF forever, while a device a live pod holds stays held (and gets its pod's name)."""
    node = gpusim_node("l40s:1")
    # no DEVICE_PLUGIN; the test kubelet started moments ago, a restart whose window would keep every entry
    agent = start_agent(node, cluster.api, KUBELET_DIR=kubelet.root, RESYNC_INTERVAL="1", KUBELET_RESTART_GRACE="1")
    agent.wait("success", "default")
    stale, alive = sorted(typed_vfs(node))
    allocate_to_pod(kubelet.root, stale, pod=None)    # allocated long ago, never listed: its pod never ran
    allocate_to_pod(kubelet.root, alive, pod=None)
    kubelet.pod_resources.add("vms", "virt-launcher-alive", "compute", R24, [alive])
    path = pod_allocations.record_path(kubelet.root)
    wait_for("the record pruned", lambda: sorted(pod_allocations.read(path)) == [alive], timeout=30)
    assert pod_allocations.read(path)[alive]["pod"] == "vms/virt-launcher-alive"
    node.clear_log()
    agent.forget_status()
    cluster.select("L40S-12Q")                        # retypes both VFs: the live pod's still stops it
    status = agent.wait("failed", "L40S-12Q")
    assert alive in status["reason"] and stale not in status["reason"], status
    assert node.log() == []
