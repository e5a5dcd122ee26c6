"""A small node for the DRA engine tests: an L40S with two typed VFs, an A16 VF with an mdev, a T4 mdev."""

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices

L40S, A16, T4 = "0000:41:00.0", "0000:51:00.0", "0000:81:00.0"
A16_UUID = "5c8f3b52-0c1c-4a4b-9f5e-0000000000aa"
T4_UUID = "7d1a0e10-2b3c-4d5e-8f90-0000000000bb"
L40S_TYPES = "ID : vGPU Name\n1155 : NVIDIA L40S-24Q\n1156 : NVIDIA L40S-48Q\n"


def build(tmp_path, l40s_vfs=2):
    node = FakeNode(tmp_path)
    node.pf(L40S, total=32)
    for vf in node.set_numvfs(L40S, l40s_vfs):
        node.set_type(vf, 1155)
        (node.dir(vf) / "nvidia/creatable_vgpu_types").write_text(L40S_TYPES)
    (node.dir(L40S) / "numa_node").write_text("1\n")
    node.mdev_gpu(A16, total=1)
    node.mdev(A16_UUID, "0000:51:00.4")
    node.device(T4, device="0x1eb8", cls="0x030000")
    (node.dir(T4) / "numa_node").write_text("-1\n")
    node.mdev_type(T4, "nvidia-222", "GRID T4-1B", 16)
    node.mdev(T4_UUID, T4, type_id="nvidia-222")
    return node


def node_facts(node):
    sysfs = Sysfs(str(node.sys))
    return facts.gather(sysfs, inuse.held_devices(sysfs, str(node.dev), str(node.proc)))


def inventory(node):
    return devices.inventory(Sysfs(str(node.sys)), node_facts(node))


def view(node):
    """The driver's NodeView of the node."""
    return devices.NodeView(Sysfs(str(node.sys)), lambda: node_facts(node))
