"""A vGPU the device plugin allocated to a pod, as the agent records it: the allocation record under
`<kubelet dir>/plugins/accelops-vgpu-device-plugin/` (kubelet/pod_resources.py writes it at Allocate and prunes it
from the kubelet's PodResources), which every node module, the node CLI and the agent read (node/holders/pod_allocations.py)
to treat the vGPU as held although no VM has opened it yet."""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pod_allocations

R24 = "nvidia.com/NVIDIA_L40S-24Q"


def allocate_to_pod(kubelet_dir, vf, pod="vms/virt-launcher-vm-a", resource=R24, allocated_at=0.0):
    """Record `vf` as allocated to `pod` ("namespace/name"; None: not listed by the kubelet yet) at `allocated_at`
    (unix seconds: 0 is long past the grace a fresh allocation gets); returns how the safety checks name it."""
    path = pod_allocations.record_path(str(kubelet_dir))
    devices = pod_allocations.read(path)
    devices[vf] = dict({"resource": resource, "allocatedAt": allocated_at}, **({"pod": pod} if pod else {}))
    pod_allocations.write(path, devices)
    return pod_allocations.holders({vf: devices[vf]})[vf][0]
