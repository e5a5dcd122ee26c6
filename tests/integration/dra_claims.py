"""A DRA claim prepared on a gpusim node as the vgpu.accelops.io driver records it: its checkpoint
under `<kubelet dir>/plugins/vgpu.accelops.io/` (kubelet/dra/checkpoint.py writes it), the record every
node module, the node CLI and the agent read (node/holders/claim_holders.py) to treat the claim's vGPUs as held."""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import checkpoint
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DRIVER
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import KubeletPaths
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.claim_holders import HOLDER

CLAIM_UID = "11111111-aaaa-4bbb-8ccc-0000000000c1"


def prepare_claim(kubelet_dir, vf, type_id, namespace="vms", name="vm-a-gpu"):
    """Record the claim `namespace/name` as prepared with the vGPU on `vf` (PCI address, type ID
    `type_id`); returns how the safety checks name it ("DRA claim ns/name")."""
    device = "vgpu-" + vf.replace(":", "-").replace(".", "-")
    record = checkpoint.Checkpoint(KubeletPaths(str(kubelet_dir)).plugin_dir(DRIVER))
    record.set(CLAIM_UID, namespace, name, checkpoint.COMPLETED, [{
        "requests": ["gpu"], "pool": "gpu-a", "device": device, "key": vf, "typeID": int(type_id),
        "cdiIDs": ["%s/vgpu=%s" % (DRIVER, device)]}])
    record.save()
    return HOLDER % (namespace, name)


def prepare_whole_claim(kubelet_dir, pf, step="bound", namespace="vms", name="vm-whole"):
    """Record the claim `namespace/name` as holding the GPU `pf` whole at `step` (kubelet/dra/whole_gpu.py: the
    device's `whole` record); returns how the safety checks name it."""
    device = "whole-gpu-" + pf.replace(":", "-").replace(".", "-")
    record = checkpoint.Checkpoint(KubeletPaths(str(kubelet_dir)).plugin_dir(DRIVER))
    record.set(CLAIM_UID, namespace, name, checkpoint.COMPLETED, [{
        "requests": ["gpu"], "pool": "gpu-a", "device": device, "key": pf, "whole": {"step": step, "offers": {}},
        "cdiIDs": ["%s/vgpu=%s" % (DRIVER, device)]}])
    record.save()
    return HOLDER % (namespace, name)
