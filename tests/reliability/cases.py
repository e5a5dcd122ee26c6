"""The bad inputs, as data: one row per case, one parametrized test per category (test_bad_inputs.py).

Every row: `id`, what to call, its arguments, and `names`: the object the one-line error must name
(the PCI address, profile, resource, file or registry). `{tmp}` stands for the case's tmp_path.
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.tests.reliability.node_lab import (
    HELD_VF, PF_EMPTY, PF_FREE, PF_HELD, PF_NIC, PF_NVME, PF_T4, TYPED_VF)


def case(case_id, run, names, bug=None, **args):
    """A row; `bug` (file/function: symptom) marks a known defect of the code under test."""
    return {"id": case_id, "run": run, "names": names, "args": args, "bug": bug}


def vdm(configs, version="v1", **extra):
    return dict({"version": version, "vgpu-configs": configs}, **extra)


VDM_24Q = {"l40s-24q": [{"devices": "all", "device-filter": "0x26B910DE", "vgpu-devices": {"L40S-24Q": 2}}]}

# --- node side: sriov_vfs and vgpu_profile through the engine, on the lab node (node_lab.py) -----
NODE = [
    case("pci-address-short", "sriov", "0000:41:00", devices=["0000:41:00"]),
    case("pci-address-bad-hex", "sriov", "0000:4g:00.0", devices=["0000:4g:00.0"]),
    case("device-path-traversal", "sriov", "../../../etc/passwd", devices=["../../../etc/passwd"]),
    case("device-absolute-path", "sriov", "/sys/bus/pci/devices/0000:41:00.0",
         devices=["/sys/bus/pci/devices/0000:41:00.0"]),
    case("unknown-pf", "sriov", "0000:99:00.0", devices=["0000:99:00.0"]),
    case("vf-given-as-pf", "sriov", TYPED_VF, devices=[TYPED_VF]),
    case("device-without-sriov", "sriov", PF_NVME, devices=[PF_NVME]),
    case("num-vfs-above-total", "sriov", PF_FREE, devices=[PF_FREE], num_vfs=33),
    case("num-vfs-negative", "sriov", "-1", devices=[PF_FREE], num_vfs=-1),
    case("num-vfs-not-a-number", "sriov", "lots", devices=[PF_FREE], num_vfs="lots"),
    case("duplicate-devices", "sriov", PF_FREE, devices=[PF_FREE, PF_FREE]),
    case("address-and-filter-overlap", "sriov", PF_FREE, devices=[PF_FREE, "10de:26b9"]),
    case("all-with-others", "sriov", PF_FREE, devices=["all", PF_FREE]),
    case("filter-matches-nothing", "sriov", "0x20B510DE", devices=["0x20B510DE"]),
    case("held-vf-disable-even-forced", "sriov", HELD_VF, devices=[PF_HELD], state="absent", force=True),
    case("programmed-vf-resize-unforced", "sriov", TYPED_VF, devices=[PF_FREE], num_vfs=4, method="sysfs"),
    case("sriov-manage-partial-count", "sriov", PF_FREE, devices=[PF_FREE], num_vfs=8, method="sriov_manage"),
    case("sriov-manage-on-a-nic", "sriov", PF_NIC, devices=[PF_NIC], method="sriov_manage"),
    case("unknown-method", "sriov", "magic", devices=[PF_FREE], method="magic"),
    case("unknown-profile", "layout", "L40S-7Q", layout=[{"devices": [PF_FREE], "profiles": {"L40S-7Q": 1}}]),
    case("profile-of-another-model", "layout", "A16-4Q", layout=[{"devices": [PF_FREE], "profiles": {"A16-4Q": 1}}]),
    case("count-above-capacity", "layout", PF_FREE, layout=[{"devices": [PF_FREE], "profiles": {"L40S-24Q": 3}}]),
    case("mixed-sizes-without-mixed-size", "layout", PF_FREE,
         layout=[{"devices": [PF_FREE], "profiles": {"L40S-24Q": 1, "L40S-12Q": 2}}]),
    case("held-vf-needs-a-change", "layout", HELD_VF, layout=[{"devices": [PF_HELD], "profiles": {"L40S-12Q": 4}}]),
    case("layout-pci-address-malformed", "layout", "0000:42:00",
         layout=[{"devices": ["0000:42:00"], "profiles": {"L40S-24Q": 1}}]),
    case("layout-device-path-traversal", "layout", "../../../../proc/self",
         layout=[{"devices": ["../../../../proc/self"], "profiles": {"L40S-24Q": 1}}]),
    case("layout-gpu-index-missing", "layout", "GPU index 7", layout=[{"devices": [7], "profiles": {"L40S-24Q": 1}}]),
    case("layout-unknown-pf", "layout", "0000:99:00.0",
         layout=[{"devices": ["0000:99:00.0"], "profiles": {"L40S-24Q": 1}}]),
    # one set of device rules for sriov_vfs and layouts (node/layout/device_selection.py)
    case("layout-vf-given-as-gpu", "layout", "is a VF of %s; select its physical function" % PF_FREE,
         layout=[{"devices": [TYPED_VF], "profiles": {"L40S-24Q": 1}}]),
    case("layout-gpu-twice-in-two-spellings", "layout", "'42:00.0' and '0000:42:00.0' select the same devices",
         layout=[{"devices": ["42:00.0", PF_FREE], "profiles": {"L40S-48Q": 1}}]),
    case("layout-gpu-twice-by-index-and-address", "layout", "%s is selected twice" % PF_FREE,
         layout=[{"devices": [1, PF_FREE], "profiles": {"L40S-48Q": 1}}]),
    case("layout-nic-given-as-gpu", "layout", "%s is not an NVIDIA GPU" % PF_NIC,
         layout=[{"devices": [PF_NIC], "profiles": {"L40S-24Q": 1}}]),
    case("vdm-gpu-index-twice", "layout", "devices: 1 and 1 select the same devices", selected="twice",
         config=vdm({"twice": [{"devices": [1, 1], "vgpu-devices": {"L40S-48Q": 1}}]})),
    case("sriov-gpu-twice-in-two-spellings", "sriov", "'42:00.0' and '0000:42:00.0' select the same devices",
         devices=["42:00.0", PF_FREE]),
    case("profile-name-path-traversal", "layout", "../../etc/shadow",
         layout=[{"devices": [PF_FREE], "profiles": {"../../etc/shadow": 1}}]),
    case("profile-count-negative", "layout", "L40S-24Q", layout=[{"devices": [PF_FREE], "profiles": {"L40S-24Q": -1}}]),
    case("device-filter-malformed", "layout", "0xZZZZ10DE",
         layout=[{"device_filter": "0xZZZZ10DE", "profiles": {"L40S-24Q": 1}}]),
    case("vdm-wrong-version", "layout", "v2", config=vdm(VDM_24Q, version="v2"), selected="l40s-24q"),
    case("vdm-unknown-top-level-key", "layout", "vgpu-config",
         config=vdm(VDM_24Q, **{"vgpu-config": {}}), selected="l40s-24q"),
    case("vdm-unknown-entry-key", "layout", "device_filter", selected="l40s-24q", config=vdm(
        {"l40s-24q": [{"devices": "all", "device_filter": "0x26B910DE", "vgpu-devices": {"L40S-24Q": 2}}]})),
    case("vdm-selected-name-missing", "layout", "l40s-8q", config=vdm(VDM_24Q), selected="l40s-8q"),
    case("vdm-several-configs-none-selected", "layout", "l40s-24q",
         config=vdm(dict(VDM_24Q, other=VDM_24Q["l40s-24q"]))),
    case("vdm-unknown-key-with-a-newline", "layout", "bad", config=vdm(VDM_24Q, **{"bad\nkey": 1}),
         selected="l40s-24q"),
    case("mixed-size-on-a-turing-gpu-after-another-gpu", "layout", PF_T4, mixed_size=True, layout=[
        {"devices": [PF_EMPTY], "profiles": {"L40S-24Q": 1, "L40S-12Q": 1}},
        {"devices": [PF_T4], "profiles": {"T4-4Q": 1, "T4-2Q": 2}}]),
    case("config-file-missing", "config_file", "{tmp}/absent.yaml", path="{tmp}/absent.yaml"),
    case("config-file-invalid-yaml", "config_file", "{tmp}/broken.yaml", path="{tmp}/broken.yaml",
         files={"broken.yaml": "version: v1\nvgpu-configs: {l40s: [\n"}),
    case("config-file-not-a-config", "config_file", "{tmp}/hosts.yaml", path="{tmp}/hosts.yaml",
         files={"hosts.yaml": "all:\n  hosts:\n    gpu-a: {}\n"}),
    case("config-file-path-traversal", "config_file", "../../../../../../etc/hostname",
         path="{tmp}/../../../../../../etc/hostname"),
]

# --- cluster side: the modules as Ansible runs them, against the API server process --------------
L40S = {"pci_vendor_selector": "10de:26b9", "resource_name": "nvidia.com/NVIDIA_L40S-24Q"}
KUBEVIRT_ARGS = {"pci_host_devices": [L40S]}
A16_MDEV = {"mdev_name_selector": "NVIDIA A16-4Q", "resource_name": "nvidia.com/NVIDIA_A16-4Q"}
HAND_WRITTEN_BOTH = ("pciVendorSelector 10DE:26B9 is permitted as nvidia.com/L40S-24Q and would also be as "
                     "nvidia.com/NVIDIA_L40S-24Q")


def cluster_case(case_id, module, names, cluster="default", bug=None, **args):
    """`cluster` names a state of the API server (test_bad_inputs.CLUSTER_STATES); `kubeconfig` in
    args is a kubeconfig fixture variant (valid, broken, missing, dict-without-context)."""
    args.setdefault("kubeconfig", "valid")
    return {"id": case_id, "module": module, "names": names, "cluster": cluster, "args": args, "bug": bug}


CLUSTER = [
    cluster_case("kubevirt-cr-absent", "kubevirt_hostdevices", "KubeVirt", cluster="no-kubevirt-cr", **KUBEVIRT_ARGS),
    cluster_case("kubevirt-crd-absent", "kubevirt_hostdevices", "kubevirts.kubevirt.io", cluster="no-kubevirt-crd",
                 **KUBEVIRT_ARGS),
    cluster_case("kubevirt-list-forbidden", "kubevirt_hostdevices", "KubeVirt", cluster="forbid-list-kubevirts",
                 **KUBEVIRT_ARGS),
    cluster_case("kubevirt-pinned-name-absent", "kubevirt_hostdevices", "kubevirt/kv", name="kv",
                 namespace="kubevirt", **KUBEVIRT_ARGS),
    cluster_case("kubevirt-name-path-traversal", "kubevirt_hostdevices", "../../../api/v1/nodes/gpu-a",
                 name="../../../api/v1/nodes/gpu-a", namespace="kubevirt", **KUBEVIRT_ARGS),
    cluster_case("node-name-path-traversal", "node_labels", "../nodes/gpu-a", name="../nodes/gpu-a",
                 profiles={"L40S-24Q": 2}),
    cluster_case("kubevirt-too-old-for-vendor-vfio", "kubevirt_hostdevices", "kubevirt/kubevirt",
                 cluster="old-kubevirt", **KUBEVIRT_ARGS),
    cluster_case("pci-vendor-selector-malformed", "kubevirt_hostdevices", "nvidia.com/NVIDIA_L40S-24Q",
                 pci_host_devices=[dict(L40S, pci_vendor_selector="10de-26b9")]),
    cluster_case("duplicate-resource-different-fields", "kubevirt_hostdevices", "nvidia.com/NVIDIA_L40S-24Q",
                 pci_host_devices=[L40S, dict(L40S, pci_vendor_selector="10de:26b5")]),
    cluster_case("kubeconfig-broken", "kubevirt_hostdevices", "{kubeconfig}", kubeconfig="broken", **KUBEVIRT_ARGS),
    cluster_case("kubeconfig-dict-clusters-not-a-list", "kubevirt_hostdevices", "kubeconfig (dict)",
                 kubeconfig="dict-clusters-not-a-list", **KUBEVIRT_ARGS),
    cluster_case("kubeconfig-missing", "kubevirt_hostdevices", "{kubeconfig}", kubeconfig="missing", **KUBEVIRT_ARGS),
    cluster_case("kubeconfig-dict-without-context", "kubevirt_hostdevices", "kubeconfig",
                 kubeconfig="dict-without-context", **KUBEVIRT_ARGS),
    # one device, one KubeVirt owner: a foreign entry for our devices fails before any write, naming both
    cluster_case("foreign-entry-same-pci-selector", "kubevirt_hostdevices", HAND_WRITTEN_BOTH,
                 cluster="hand-written-l40s", **KUBEVIRT_ARGS),
    cluster_case("foreign-entry-lower-case-selector", "kubevirt_hostdevices", HAND_WRITTEN_BOTH,
                 cluster="hand-written-l40s-lower-case", **KUBEVIRT_ARGS),
    cluster_case("foreign-entry-external-provider", "kubevirt_hostdevices", HAND_WRITTEN_BOTH,
                 cluster="hand-written-l40s-external", **KUBEVIRT_ARGS),
    cluster_case("foreign-entry-same-mdev-selector", "kubevirt_hostdevices",
                 "mdevNameSelector NVIDIA A16-4Q is permitted as example.org/a16-small and would also be as "
                 "nvidia.com/NVIDIA_A16-4Q", cluster="hand-written-a16-mdev", mediated_devices=[A16_MDEV]),
    cluster_case("take-over-of-another-foreign-name", "kubevirt_hostdevices", HAND_WRITTEN_BOTH,
                 cluster="hand-written-l40s", take_over=["intel.com/x710"], **KUBEVIRT_ARGS),
    cluster_case("two-of-ours-for-one-selector", "kubevirt_hostdevices",
                 "pciVendorSelector 10DE:26B9 is listed for both nvidia.com/NVIDIA_L40S-24Q and nvidia.com/NVIDIA_L40S",
                 pci_host_devices=[L40S, dict(L40S, resource_name="nvidia.com/NVIDIA_L40S")]),
    cluster_case("cluster-policy-absent", "gpu_operator_policy", "cluster-policy", cluster="no-cluster-policy",
                 sandbox_workloads_enabled=True),
    cluster_case("vgpu-manager-version-with-os-tag", "gpu_operator_policy", "580.82.02-ubuntu22.04",
                 vgpu_manager={"enabled": True, "version": "580.82.02-ubuntu22.04"}),
    cluster_case("node-absent", "node_labels", "gpu-z", name="gpu-z", profiles={"L40S-24Q": 2}),
    cluster_case("node-label-profile-invalid", "node_labels", "L40S 24Q", name="gpu-a", profiles={"L40S 24Q": 2}),
]

# --- build host: vgpu_manager_image and vgpu_driver through their engines ------------------------
GOOD_RUNFILE = "NVIDIA-Linux-x86_64-570.172.07-vgpu-kvm.run"


def image_case(case_id, names, bug=None, **params):
    """vgpu_manager_image parameters on top of a valid private-registry build (test_bad_inputs)."""
    return {"id": case_id, "names": names, "params": params, "bug": bug}


IMAGE = [
    image_case("runfile-missing", "{tmp}/NVIDIA-Linux-x86_64-570.172.07-vgpu-kvm-gone.run",
               runfile="{tmp}/NVIDIA-Linux-x86_64-570.172.07-vgpu-kvm-gone.run"),
    image_case("runfile-not-vgpu-kvm", "NVIDIA-Linux-x86_64-570.172.07.run",
               runfile="{tmp}/NVIDIA-Linux-x86_64-570.172.07.run"),
    image_case("runfile-without-makeself-header", "NVIDIA-Linux-x86_64-570.172.08-vgpu-kvm.run",
               runfile="{tmp}/NVIDIA-Linux-x86_64-570.172.08-vgpu-kvm.run"),
    image_case("public-registry-docker-hub", "docker.io", name="docker.io/acme/vgpu-manager"),
    image_case("public-registry-implicit-docker-hub", "docker.io", name="acme/vgpu-manager"),
    image_case("public-registry-nvcr", "nvcr.io", name="nvcr.io/acme/vgpu-manager"),
    image_case("public-registry-gcr-region", "eu.gcr.io", name="eu.gcr.io/acme/vgpu-manager"),
    image_case("image-name-upper-case", "registry.example.com/Acme/VGPU", name="registry.example.com/Acme/VGPU"),
    image_case("os-tag-with-space", "ubuntu 24.04", os_tag="ubuntu 24.04"),
    image_case("driver-version-mismatch", "580.82.02", driver_version="580.82.02"),
    image_case("context-file-name-traversal", "../entrypoint.sh", context_files={"../entrypoint.sh": "#!/bin/sh\n"}),
    image_case("context-path-name-absolute", "/usr/local/bin/accelops-vgpu",
               context_paths={"/usr/local/bin/accelops-vgpu": "{tmp}/" + GOOD_RUNFILE}),
    image_case("context-path-file-missing", "{tmp}/accelops-vgpu.pyz",
               context_paths={"accelops-vgpu.pyz": "{tmp}/accelops-vgpu.pyz"}),
]

DRIVER = [
    image_case("driver-runfile-missing", "{tmp}/NVIDIA-Linux-x86_64-580.82.02-vgpu-kvm.run",
               runfile="{tmp}/NVIDIA-Linux-x86_64-580.82.02-vgpu-kvm.run"),
    image_case("driver-runfile-not-vgpu-kvm", "NVIDIA-Linux-x86_64-570.172.07.run",
               runfile="{tmp}/NVIDIA-Linux-x86_64-570.172.07.run"),
    image_case("driver-runfile-version-lies", "NVIDIA-Linux-x86_64-580.82.03-vgpu-kvm.run",
               runfile="{tmp}/NVIDIA-Linux-x86_64-580.82.03-vgpu-kvm.run"),
    image_case("driver-downgrade-refused", "550.54.16", runfile="{tmp}/NVIDIA-Linux-x86_64-550.54.16-vgpu-kvm.run"),
    image_case("driver-absent-with-bad-runfile", "NVIDIA-Linux-x86_64-570.172.07.run", state="absent",
               runfile="{tmp}/NVIDIA-Linux-x86_64-570.172.07.run"),
    # an upgrade stops the vGPU manager: refused while a VM holds a VF (the lab's HELD_VF), before the first stop
    image_case("driver-upgrade-with-held-vf", HELD_VF, runfile="{tmp}/NVIDIA-Linux-x86_64-575.51.02-vgpu-kvm.run",
               proc_root="/proc", dev_root="{dev}"),
    image_case("driver-absent-with-held-vf", HELD_VF, state="absent", proc_root="/proc", dev_root="{dev}"),
    image_case("driver-upgrade-without-kernel-headers", "{tmp}/no-headers",
               runfile="{tmp}/NVIDIA-Linux-x86_64-575.51.02-vgpu-kvm.run", modules_dir="{tmp}/no-headers"),
]

# --- a representative subset end to end: node modules as Ansible runs them, roles in playbooks ----
# `{root}`, `{dev}` and `{tmp}` stand for the lab node's sysfs root, its /dev and the case's tmp_path.
ROOTS = {"sysfs_root": "{root}", "dev_root": "{dev}"}


def module_case(case_id, module, names, bug=None, roots=None, **args):
    """`roots`: the node root options the module takes (default sysfs_root and dev_root)."""
    return {"id": case_id, "module": module, "names": names, "args": dict(roots or ROOTS, **args), "bug": bug}


NODE_MODULES = [
    module_case("sriov-vfs-held-vf", "sriov_vfs", HELD_VF, devices=[PF_HELD], state="absent", force=True),
    module_case("sriov-vfs-path-traversal", "sriov_vfs", "../../../etc", devices=["../../../etc"]),
    module_case("vgpu-profile-other-model", "vgpu_profile", "A16-4Q",
                layout=[{"devices": [PF_FREE], "profiles": {"A16-4Q": 1}}]),
    module_case("vgpu-profile-config-and-layout", "vgpu_profile", "config",
                config=vdm(VDM_24Q), layout=[{"devices": "all", "profiles": {"L40S-24Q": 1}}]),
    module_case("vgpu-profile-config-file-missing", "vgpu_profile", "{tmp}/vgpu.json", config_file="{tmp}/vgpu.json"),
    module_case("vgpu-driver-runfile-not-vgpu-kvm", "vgpu_driver", "{tmp}/NVIDIA-Linux-x86_64-570.172.07.run",
                runfile="{tmp}/NVIDIA-Linux-x86_64-570.172.07.run", modprobe_dir="{tmp}/modprobe.d",
                proc_root="{tmp}/proc", roots={"sysfs_root": "{root}"}),
]


A16_ON_L40S = {"devices": "all", "device_filter": "0x26B910DE", "profiles": {"A16-4Q": 1}}


def role_case(case_id, role, names, bug=None, **role_vars):
    return {"id": case_id, "role": role, "names": names, "vars": role_vars, "bug": bug}


ROLES = [
    role_case("role-sriov-num-vfs-above-total", "sriov", PF_FREE, sriov_devices=[PF_FREE], sriov_num_vfs=64,
              sriov_sysfs_root="{root}", sriov_dev_root="{dev}"),
    role_case("role-vgpu-profiles-profile-of-another-model", "vgpu_profiles", "A16-4Q",
              vgpu_profiles_configs={"a16": [A16_ON_L40S]},
              vgpu_profiles_selected="a16", vgpu_profiles_sysfs_root="{root}", vgpu_profiles_dev_root="{dev}",
              vgpu_profiles_install_root="{tmp}/node", vgpu_profiles_manage_service=False),
]
