import os
import subprocess
import sys

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils import gpu_models


@pytest.mark.parametrize("vendor,device,expected", [
    ("10de", "26b9", "L40S"),
    ("10DE", "26B9", "L40S"),
    ("10de", "2336", "H100 SXM5"),
    ("10de", "2bb5", "RTX PRO 6000 Blackwell"),
    ("10de", "25b6", "A2/A16"),
    ("10de", "1eb8", "T4"),
])
def test_known_ids_name_their_model(vendor, device, expected):
    assert gpu_models.model_name(vendor, device) == expected


@pytest.mark.parametrize("vendor,device", [
    ("10de", "ffff"),      # unknown NVIDIA device
    ("8086", "26b9"),      # same device ID, other vendor
    (None, "26b9"),        # unreadable vendor
    ("10de", None),
])
def test_unknown_ids_have_no_model(vendor, device):
    assert gpu_models.model_name(vendor, device) is None


def test_table_keys_are_normalised_device_ids():
    assert all(len(key) == 4 and key == key.lower() for key in gpu_models.NVIDIA_MODELS)


def test_vgpu_offers_are_catalogued_models_whose_largest_profile_is_the_framebuffer():
    for device, (prefix, framebuffer_gb, offers) in gpu_models.VGPU_OFFERS.items():
        assert gpu_models.model_name("10de", device).replace(" PCIe", "") == prefix
        assert max(size for sizes in offers.values() for size in sizes) == framebuffer_gb
        assert all(framebuffer_gb % size == 0 for sizes in offers.values() for size in sizes)


def test_vgpu_offer_lookup():
    assert gpu_models.vgpu_offer("10DE", "26B9")[:2] == ("L40S", 48)
    assert gpu_models.vgpu_offer("10de", "2335") is None and gpu_models.vgpu_offer("8086", "26b9") is None


def test_the_catalog_imports_nothing_of_the_node_engine():
    """Issue 24: the catalog is below the node engine (node/hw/pci.py takes the vendor ID from it)."""
    code = ("import sys; from ansible_collections.accelops.vgpu.plugins.module_utils import gpu_models; "
            "print(sorted(m for m in sys.modules if '.module_utils.' in m))")
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environ).stdout
    assert ".module_utils.node" not in loaded and "gpu_models" in loaded
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci
    assert pci.NVIDIA_VENDOR == gpu_models.NVIDIA_VENDOR == "10de"
