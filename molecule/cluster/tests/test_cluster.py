# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster as the API emulator holds it after site.yml: KubeVirt permits the node's vGPUs
(and still the entry another team owns), the node carries its profile labels."""

from __future__ import annotations

import json
import os
import urllib.request

STATE_DIR = os.path.join(os.environ["MOLECULE_PROJECT_DIRECTORY"], ".build", "molecule", "cluster")
NODE = "vgpu-mol-cluster"


def api_get(path):
    with open(os.path.join(STATE_DIR, "kubeconfig"), encoding="utf-8") as handle:
        server = json.load(handle)["clusters"][0]["cluster"]["server"]
    with urllib.request.urlopen(server + path, timeout=10) as response:
        return json.load(response)


def permitted():
    kubevirt = api_get("/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt")
    return kubevirt["spec"]["configuration"]["permittedHostDevices"]


def test_kubevirt_permits_the_vendor_vfio_vgpus_by_pci_id():
    entries = {entry["resourceName"]: entry for entry in permitted()["pciHostDevices"]}
    assert entries["nvidia.com/NVIDIA_L40S-24Q"]["pciVendorSelector"] == "10DE:26B9"
    assert entries["intel.com/x710"]["pciVendorSelector"] == "8086:1572"


def test_the_hand_written_entry_for_the_same_device_was_taken_over():
    selectors = [entry["pciVendorSelector"].upper() for entry in permitted()["pciHostDevices"]]
    assert selectors.count("10DE:26B9") == 1
    assert "nvidia.com/L40S-24Q" not in {entry["resourceName"] for entry in permitted()["pciHostDevices"]}


def test_kubevirt_permits_the_mdev_vgpus_by_type_name():
    entries = {entry["resourceName"]: entry for entry in permitted()["mediatedDevices"]}
    assert entries["nvidia.com/GRID_T4-8Q"]["mdevNameSelector"] == "GRID T4-8Q"


def test_node_is_labelled_with_its_profiles():
    labels = api_get("/api/v1/nodes/" + NODE)["metadata"]["labels"]
    assert labels["accelops.io/vgpu.profile.L40S-24Q"] == "2"
    assert labels["accelops.io/vgpu.profile.T4-8Q"] == "2"
    assert labels["nvidia.com/gpu.workload.config"] == "vm-vgpu"
