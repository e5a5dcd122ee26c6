"""The hardware catalogue: every fact gpusim simulates, with its source or marked as an assumption.

This is the ONE place hardware facts live. Source keys are those of the project's domain brief
(/work/shared/docs/domain-brief.md, §0): HPD = harvester/pcidevices fixtures, VDM =
NVIDIA/vgpu-device-manager, cubecos = bigstack-oss/cubecos issues. `ASSUMED` marks a value nobody
has confirmed; change it here and every test and the README table follow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ASSUMED = "ASSUMPTION"

# Frameworks: how vGPUs are made on a model.
VENDOR_VFIO = "vendor-vfio"   # SR-IOV VF stays on nvidia, typed via nvidia/current_vgpu_type (brief §1)
MDEV_ON_VF = "mdev-vf"        # Ampere: VFs are mdev parents, one instance each (brief §2)
MDEV_ON_PF = "mdev-pf"        # Turing and older: the PF is the mdev parent (brief §2)
SRIOV_ONLY = "sriov"          # plain SR-IOV device (NIC)
NONE = "none"                 # no SR-IOV, no vGPU (NVMe)

CLASS_3D = "0x030200"         # NVIDIA datacenter GPUs and their VFs (brief §3, HPD A2 VF `class`)
CLASS_ETHERNET = "0x020000"   # PCI class code Ethernet controller (PCI code and ID assignment spec)
CLASS_NVME = "0x010802"       # PCI class code NVM Express (PCI code and ID assignment spec)


@dataclass(frozen=True)
class Driver:
    """A kernel driver as far as sysfs can tell."""

    name: str
    sriov_configure: bool       # has the .sriov_configure hook (else sriov_numvfs writes -> ENOENT)
    disables_sriov_on_remove: bool  # unbinding a PF from it removes its VFs
    ids: tuple = ()             # (vendor, device) pairs it binds to on probe/bind
    source: str = ""


DRIVERS = {
    "nvidia": Driver(
        "nvidia", sriov_configure=False, disables_sriov_on_remove=True,
        source="sriov_configure: " + ASSUMED + " from sriov-manage binding the PF to pci-pf-stub before "
        "writing sriov_numvfs (brief §1.5, §3; cozystack#2608 disagrees); remove disabling VFs: " + ASSUMED),
    "pci-pf-stub": Driver(
        "pci-pf-stub", sriov_configure=True, disables_sriov_on_remove=False,
        source="kernel drivers/pci/pci-pf-stub.c: .sriov_configure = pci_sriov_configure_simple, no remove"),
    "i40e": Driver(
        "i40e", sriov_configure=True, disables_sriov_on_remove=True,
        source="kernel drivers/net/ethernet/intel/i40e: i40e_pci_sriov_configure; i40e_remove frees VFs"),
    "iavf": Driver("iavf", sriov_configure=False, disables_sriov_on_remove=False,
                   source="kernel drivers/net/ethernet/intel/iavf (VF driver)"),
    "nvme": Driver("nvme", sriov_configure=False, disables_sriov_on_remove=False,
                   source="kernel drivers/nvme/host/pci.c"),
    "vfio-pci": Driver("vfio-pci", sriov_configure=True, disables_sriov_on_remove=True,
                       source="kernel drivers/vfio/pci/vfio_pci.c (binds only via new_id/driver_override)"),
}


@dataclass(frozen=True)
class VgpuType:
    """One vGPU type: `type_id` is the vendor-VFIO ID or the N of mdev `nvidia-N`."""

    type_id: int
    name: str                   # full name as the driver prints it
    framebuffer_gib: int
    max_instances: int          # per physical GPU
    gi_profile: int = None      # MIG-backed: the GPU instance profile ID it needs (one vGPU per GI)

    @property
    def short_name(self):
        return self.name.split()[-1]


@dataclass(frozen=True)
class Model:
    key: str                    # what SPEC uses
    product: str                # nvidia-smi "Product Name"
    vendor: str
    device: str
    subsystem_vendor: str
    subsystem_device: str
    pci_class: str
    framework: str
    driver: str                 # PF driver
    vf_driver: str = ""         # driver VFs bind to when autoprobed
    vf_device: str = ""         # VF device ID (sriov_vf_device)
    total_vfs: int = 0
    vf_offset: int = 0
    vf_stride: int = 0
    framebuffer_gib: int = 0
    gpus_per_board: int = 1     # A16: 4 physical GPUs, each its own PF
    mixed_size: bool = False    # supports nvidia-smi vgpu -shm 1
    types: tuple = ()
    gi_profiles: tuple = ()     # MIG GPU instance profiles (empty: no MIG)
    mig_types: tuple = ()       # MIG-backed vGPU types (listed only in MIG mode)
    sources: dict = field(default_factory=dict)

    @property
    def pci_id(self):
        return "%s:%s" % (self.vendor, self.device)

    @property
    def sriov(self):
        return self.total_vfs > 0

    @property
    def is_gpu(self):
        return self.vendor == "10de"

    @property
    def mig(self):
        return bool(self.gi_profiles)

    @property
    def all_types(self):
        return tuple(self.types) + tuple(self.mig_types)

    def type_by_id(self, type_id):
        for vgpu_type in self.all_types:
            if vgpu_type.type_id == type_id:
                return vgpu_type
        return None

    def gi_profile(self, profile_id):
        for profile in self.gi_profiles:
            if profile.profile_id == profile_id:
                return profile
        return None


def _types(prefix, first_id, specs, framebuffer_gib, max_count, name_style="NVIDIA %s-%s"):
    """Consecutive type IDs for `specs` (suffixes like '1Q'); max per GPU = framebuffer / size,
    capped at `max_count` (the VF count for one-VF-per-vGPU frameworks)."""
    result = []
    for offset, suffix in enumerate(specs):
        size = _size(suffix)
        result.append(VgpuType(first_id + offset, name_style % (prefix, suffix), size,
                               min(framebuffer_gib // size, max_count)))
    return tuple(result)


def _ada_types(prefix, ids):
    """Ada 48 GB board (L40S, L40): B, Q and A series; `ids` maps suffix -> type ID."""
    return tuple(sorted((VgpuType(type_id, "NVIDIA %s-%s" % (prefix, suffix), _size(suffix),
                                  min(48 // _size(suffix), 32)) for suffix, type_id in ids.items()),
                        key=lambda vgpu_type: vgpu_type.type_id))


def _size(suffix):
    """Framebuffer GiB of a profile suffix: the leading number ('24Q' -> 24, '2B4' -> 2)."""
    return int(re.match(r"\d+", suffix).group(0))


_ADA_SUFFIXES = ["1B", "2B", "1Q", "2Q", "3Q", "4Q", "6Q", "8Q", "12Q", "16Q", "24Q", "48Q",
                 "1A", "2A", "3A", "4A", "6A", "8A", "12A", "16A", "24A", "48A"]
# L40S type IDs: HPD pkg/util/gpuhelper/gpuhelper.go comment and fixture (brief §9): 1145..1166 in
# the order above, plus 2164 = L40S-3B. Driver release unrecorded.
L40S_TYPE_IDS = dict(zip(_ADA_SUFFIXES, range(1145, 1167)), **{"3B": 2164})
# L40: same shape as L40S (VDM lists the same L40-nQ counts); the IDs are ASSUMED (block before L40S).
L40_TYPE_IDS = dict(zip(_ADA_SUFFIXES, range(1123, 1145)), **{"3B": 2163})

_MDEV_AMPERE_SUFFIXES = ["1B", "2B", "1Q", "2Q", "4Q", "8Q", "16Q", "1A", "2A", "4A", "8A", "16A",
                         "4C", "8C", "16C"]


@dataclass(frozen=True)
class GiProfile:
    """A MIG GPU instance profile (`nvidia-smi mig -lgip` / `-lgipp`)."""

    profile_id: int
    name: str                   # "1g.10gb", "1g.10gb+me"
    compute_slices: int         # of MIG_COMPUTE_SLICES
    size: int                   # memory slices, of MIG_MEMORY_SLICES
    starts: tuple               # allowed placement starts (memory slice index)
    max_instances: int
    memory_gib: float
    engines: tuple = (0, 0, 0, 0, 0, 0)   # SM, DEC, ENC, CE, JPEG, OFA as `-lgip` prints them


# Hopper MIG geometry: 7 compute and 8 memory slices; placements as `nvidia-smi mig -lgipp` prints
# them in NVIDIA's MIG user guide (H100/A100 examples: 1g {0..6}:1, 1g double memory {0,2,4,6}:2,
# 2g {0,2,4}:2, 3g {0,4}:4, 4g {0}:4, 7g {0}:8). Profile IDs, instance counts, memory and the engine
# columns (SM, DEC, ENC / CE, JPEG, OFA) as a real H100 80GB HBM3 prints them with driver 580.159.04
# (captures/nvidia-smi-mig-lgip-h100.txt); other Hopper boards share the IDs and engine counts: ASSUMED.
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8
_HOPPER_SHAPES = [  # (profile ID, compute slices, memory slices, starts, max instances, name suffix, size index,
    #                  (SM, DEC, ENC, CE, JPEG, OFA) on H100 80GB)
    (19, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7, "", 0, (16, 1, 0, 1, 1, 0)),
    (20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, "+me", 0, (16, 1, 0, 1, 1, 1)),
    (15, 1, 2, (0, 2, 4, 6), 4, "", 1, (26, 1, 0, 1, 1, 0)),
    (14, 2, 2, (0, 2, 4), 3, "", 1, (32, 2, 0, 2, 2, 0)),
    (9, 3, 4, (0, 4), 2, "", 2, (60, 3, 0, 3, 3, 0)),
    (5, 4, 4, (0,), 1, "", 2, (64, 4, 0, 4, 4, 0)),
    (0, 7, 8, (0,), 1, "", 3, (132, 7, 0, 8, 7, 1)),
]
# GiB that `-lgip` shows for 1, 2, 4 and 8 memory slices: H100 80GB from the capture; the 141 GB boards
# as 97 % of the name's size: ASSUMED.
H100_80GB_MIG_MEMORY = (9.75, 19.62, 39.50, 79.25)


def _hopper_mig(prefix, sizes_gb, first_type_id, memory_gib=None):
    """GI profiles and MIG-backed vGPU types of a Hopper board; `sizes_gb` are the framebuffer sizes of
    1, 2, 4 and 8 memory slices (H100 80GB: 10, 20, 40, 80), the GB in both the MIG and the vGPU
    names (`1g.10gb` <-> `H100-1-10C`, `+me` <-> `ME`; VDM ToMigConfigSpecSlice, brief §11)."""
    profiles, types = [], []
    memory_gib = memory_gib or tuple(round(gib * 0.97, 2) for gib in sizes_gb)
    for offset, (profile_id, compute, size, starts, count, suffix, index, engines) in enumerate(_HOPPER_SHAPES):
        gib = sizes_gb[index]
        profiles.append(GiProfile(profile_id, "%dg.%dgb%s" % (compute, gib, suffix), compute, size, starts, count,
                                  memory_gib[index], engines))
        vgpu_name = "NVIDIA %s-%d-%dC%s" % (prefix, compute, gib, "ME" if suffix == "+me" else "")
        types.append(VgpuType(first_type_id + offset, vgpu_name, gib, count, gi_profile=profile_id))
    return tuple(profiles), tuple(types)


H100_GI_PROFILES, H100_MIG_TYPES = _hopper_mig("H100", (10, 20, 40, 80), 1118, H100_80GB_MIG_MEMORY)
H200X_GI_PROFILES, H200X_MIG_TYPES = _hopper_mig("H200X", (18, 35, 71, 141), 1414)
H200_NVL_GI_PROFILES, H200_NVL_MIG_TYPES = _hopper_mig("H200", (18, 35, 71, 141), 1445)

MODELS = {m.key: m for m in [
    Model(
        key="l40s", product="NVIDIA L40S", vendor="10de", device="26b9", subsystem_vendor="10de",
        subsystem_device="1851", pci_class=CLASS_3D, framework=VENDOR_VFIO, driver="nvidia",
        vf_driver="nvidia", vf_device="26b9", total_vfs=32, vf_offset=4, vf_stride=1,
        framebuffer_gib=48, mixed_size=True, types=_ada_types("L40S", L40S_TYPE_IDS),
        sources={
            "pci_id": "brief §9 (VDM config-example; public lspci '[10de:26b9]', class 0302)",
            "subsystem_device": ASSUMED,
            "total_vfs": "harvester/harvester#6487 ('32VFs'), brief §1.5",
            "vf_offset/stride": "first VF at .4: HPD comment 0000:3d:00.4 (brief §1.5); stride 1 " + ASSUMED,
            "vf_device": "VF ID = PF ID (brief §3, inferred; UNCONFIRMED on L40S)",
            "types": "HPD fixture IDs (brief §9); max = 48 GB / size, 1Q:32 (VDM config-example)",
            "mixed_size": "cubecos#1316 'Heterogeneous Time-Slice Sizes : Supported' on RTX PRO 6000; "
                          "on L40S " + ASSUMED,
        }),
    Model(
        key="l40", product="NVIDIA L40", vendor="10de", device="26b5", subsystem_vendor="10de",
        subsystem_device="169d", pci_class=CLASS_3D, framework=VENDOR_VFIO, driver="nvidia",
        vf_driver="nvidia", vf_device="26b5", total_vfs=32, vf_offset=4, vf_stride=1,
        framebuffer_gib=48, mixed_size=True, types=_ada_types("L40", L40_TYPE_IDS),
        sources={"pci_id": "brief §9 (VDM default -> L40-24Q)",
                 "subsystem_device": ASSUMED, "total_vfs/offset/stride": ASSUMED + " (same as L40S)",
                 "types": "names/counts as L40S (VDM); IDs " + ASSUMED}),
    Model(
        key="h100-pcie", product="NVIDIA H100 PCIe", vendor="10de", device="2331", subsystem_vendor="10de",
        subsystem_device="1626", pci_class=CLASS_3D, framework=VENDOR_VFIO, driver="nvidia",
        vf_driver="nvidia", vf_device="2331", total_vfs=32, vf_offset=4, vf_stride=1,
        framebuffer_gib=80, mixed_size=True,
        types=_types("H100", 1110, ["4C", "5C", "8C", "10C", "16C", "20C", "40C", "80C"], 80, 32),
        gi_profiles=H100_GI_PROFILES, mig_types=H100_MIG_TYPES,
        sources={"pci_id": "brief §9 (VDM H100-40C; public lspci 'GH100 [H100 PCIe]')",
                 "subsystem_device": ASSUMED, "total_vfs/offset/stride": ASSUMED,
                 "types": "C-series names per NVIDIA profile naming; IDs and set " + ASSUMED,
                 "mig": "MIG-backed names and maxima: NVIDIA AIE Hopper vGPU types (brief §11); GI IDs: public "
                        "-lgip notes; type IDs " + ASSUMED}),
    Model(
        # What a VM guest sees of a whole H100 passed through to it (captures/sysfs-pf-h100-guest.txt,
        # nvidia-smi-q-h100-580.txt): the PF on `nvidia`, no SR-IOV capability (no sriov_* files),
        # Virtualization Mode "Pass-Through", MIG available. Not a vGPU host: no VFs, no vGPU types.
        key="h100-guest", product="NVIDIA H100 80GB HBM3", vendor="10de", device="2330", subsystem_vendor="10de",
        subsystem_device="16c1", pci_class=CLASS_3D, framework=NONE, driver="nvidia",
        framebuffer_gib=80, gi_profiles=H100_GI_PROFILES,
        sources={"pci_id/subsystem/class/driver": "captures/sysfs-pf-h100-guest.txt (real H100 SXM5, 2026-11-27)",
                 "mig": "captures/nvidia-smi-mig-lgip-h100.txt"}),
    Model(
        key="h200", product="NVIDIA H200", vendor="10de", device="2335", subsystem_vendor="10de",
        subsystem_device="18be", pci_class=CLASS_3D, framework=VENDOR_VFIO, driver="nvidia",
        vf_driver="nvidia", vf_device="2335", total_vfs=32, vf_offset=4, vf_stride=1,
        framebuffer_gib=141, mixed_size=True,
        types=_types("H200X", 1423, ["4C", "8C", "16C", "35C", "70C", "141C"], 141, 32),
        gi_profiles=H200X_GI_PROFILES, mig_types=H200X_MIG_TYPES,
        sources={"mig": "H200X-1-18C = 1414 (public code sample, brief §9); names/maxima AIE Hopper table, MIG "
                        "names mig-parted hopper-blackwell example (1g.18gb..7g.141gb); other IDs " + ASSUMED,
                 "pci_id": "brief §9 (VDM H200X-70C; gpu-operator#2594 'H200 SXM 141GB (10de:2335)')",
                 "vf_offset": "H200 README VF 41:00.4 (brief §1.5); stride, total " + ASSUMED,
                 "subsystem_device": ASSUMED,
                 "types": "H200X-141C = 1428 (public code sample, brief §9); other IDs/sizes " + ASSUMED}),
    Model(
        key="h200-nvl", product="NVIDIA H200 NVL", vendor="10de", device="233b", subsystem_vendor="10de",
        subsystem_device="1992", pci_class=CLASS_3D, framework=VENDOR_VFIO, driver="nvidia",
        vf_driver="nvidia", vf_device="233b", total_vfs=32, vf_offset=4, vf_stride=1,
        framebuffer_gib=141, mixed_size=True,
        types=_types("H200", 1439, ["4C", "8C", "16C", "35C", "70C", "141C"], 141, 32),
        gi_profiles=H200_NVL_GI_PROFILES, mig_types=H200_NVL_MIG_TYPES,
        sources={"pci_id": "brief §9 (VDM H200-70C 0x233B)", "subsystem_device": ASSUMED,
                 "total_vfs/offset/stride": ASSUMED + " (as H200 SXM)",
                 "types": "'H200-' names (brief §11 table); IDs " + ASSUMED,
                 "mig": "as H200 SXM with 'H200-' names; IDs " + ASSUMED}),
    Model(
        key="a16", product="NVIDIA A16", vendor="10de", device="25b6", subsystem_vendor="10de",
        subsystem_device="14a9", pci_class=CLASS_3D, framework=MDEV_ON_VF, driver="nvidia",
        vf_driver="nvidia", vf_device="25b6", total_vfs=16, vf_offset=4, vf_stride=1,
        framebuffer_gib=16, gpus_per_board=4,
        types=_types("A16", 685, _MDEV_AMPERE_SUFFIXES, 16, 16),
        sources={"pci_id": "brief §9 (VDM A16-8Q 0x25B6)", "gpus_per_board": "4 GPUs x 16 GB (A16 datasheet)",
                 "subsystem_device": ASSUMED + " (tells A16 from A2, same device ID)",
                 "total_vfs/offset/stride": ASSUMED, "types": "names like A2; nvidia-N numbers " + ASSUMED}),
    Model(
        key="a2", product="NVIDIA A2", vendor="10de", device="25b6", subsystem_vendor="10de",
        subsystem_device="157e", pci_class=CLASS_3D, framework=MDEV_ON_VF, driver="nvidia",
        vf_driver="nvidia", vf_device="25b6", total_vfs=16, vf_offset=4, vf_stride=1,
        framebuffer_gib=16,
        types=_types("A2", 742, _MDEV_AMPERE_SUFFIXES, 16, 16),
        sources={"pci_id": "brief §9; HPD A2 VF device 0x25b6 class 0x030200",
                 "types": "nvidia-742..756 = A2-1B..A2-16C (HPD fixture); order within " + ASSUMED,
                 "subsystem_device": ASSUMED, "total_vfs/offset/stride": ASSUMED}),
    Model(
        key="t4", product="Tesla T4", vendor="10de", device="1eb8", subsystem_vendor="10de",
        subsystem_device="12a2", pci_class=CLASS_3D, framework=MDEV_ON_PF, driver="nvidia",
        framebuffer_gib=16,
        types=_types("T4", 222, ["1B", "2B", "2B4", "1A", "2A", "4A", "8A", "16A",
                                 "1Q", "2Q", "4Q", "8Q", "16Q"], 16, 16, name_style="GRID %s-%s"),
        sources={"pci_id": "brief §9 (VDM; KVUG)", "framework": "PF is the mdev parent (GPUOP, brief §2)",
                 "types": "'GRID T4-1Q' style names (KVUG); nvidia-222.. numbering " + ASSUMED,
                 "mixed_size": "Turing lacks mixed-size mode (NVIDIA AIE docs, brief §1.4)",
                 "subsystem_device": ASSUMED}),
    Model(
        key="nic", product="Intel Ethernet Controller X710", vendor="8086", device="1572",
        subsystem_vendor="8086", subsystem_device="0001", pci_class=CLASS_ETHERNET, framework=SRIOV_ONLY,
        driver="i40e", vf_driver="iavf", vf_device="154c", total_vfs=64, vf_offset=16, vf_stride=1,
        sources={"pci_id": "pci.ids 8086:1572 (X710 for 10GbE SFP+), VF 8086:154c",
                 "total_vfs/offset/stride": ASSUMED}),
    Model(
        key="nvme", product="Samsung PM9A3", vendor="144d", device="a80a", subsystem_vendor="144d",
        subsystem_device="a812", pci_class=CLASS_NVME, framework=NONE, driver="nvme",
        sources={"pci_id": "pci.ids 144d:a80a", "subsystem_device": ASSUMED}),
]}

DEFAULT_DRIVER_VERSION = "570.172.07"
MAX_VFS_PER_PF = 100   # layout reserves 100 IOMMU groups per PF (see layout.py)

assert all(m.total_vfs <= MAX_VFS_PER_PF for m in MODELS.values())
