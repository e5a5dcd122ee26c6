"""gpusim against reference output (captures/README.md names the sources): `nvidia-smi -q` (the MIG Mode
and GPU Virtualization Mode sections, driver 580's layout), `nvidia-smi mig -lgip` byte for byte, the PCI
identity of a real H100, and the `numa_node` file of PFs and VFs."""

import os
import re
import subprocess

from simhelpers import sriov_manage

CAPTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "captures")


def capture(name):
    with open(os.path.join(CAPTURES, name)) as handle:
        return handle.read()


def layout(line):
    """A `key : value` line without its value: indentation, key and the column of the colon."""
    key, sep, dummy = line.partition(":")
    return key + sep if sep else line


def mig_sections(text):
    """[(PCI bus ID, [the MIG Mode line and the lines under it])] of an `nvidia-smi -q` output."""
    found, lines = [], text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("GPU "):
            gpu = line.split()[1]
        if line.strip() == "MIG Mode":
            found.append((gpu, lines[index:index + 3]))
    return found


def values(section):
    return [line.rpartition(":")[2].strip() for line in section[1:]]


def query(node):
    return subprocess.run(["nvidia-smi", "-q"], env=node.env, capture_output=True, text=True, check=True).stdout


def test_nvidia_smi_q_has_the_mig_mode_section_as_the_real_tool_prints_it(gpusim_node):
    node = gpusim_node("h100-pcie:1,l40s:1")
    h100 = node.pfs()[0]
    reference = mig_sections(capture("nvidia-smi-q-h100-580.txt"))[0][1]
    # the older driver's capture has the same section, keys and order (only the colon column moved)
    older = mig_sections(capture("nvidia-smi-q-mig.txt"))[0][1]
    assert [" ".join(layout(line).split()) for line in older] == [" ".join(layout(line).split()) for line in reference]
    sections = dict(mig_sections(query(node)))
    assert sorted(sections) == ["00000000:41:00.0", "00000000:42:00.0"]
    for gpu, lines in sections.items():
        assert [layout(line) for line in lines] == [layout(line) for line in reference], gpu
    assert values(sections["00000000:41:00.0"]) == ["Disabled", "Disabled"]
    assert values(sections["00000000:42:00.0"]) == ["N/A", "N/A"]          # no MIG on Ada (nvidia-smi(1))
    node.ctl("mig", h100, "1")
    assert values(dict(mig_sections(query(node)))["00000000:41:00.0"]) == ["Enabled", "Enabled"]
    # the top-level lines keep the capture's colon column too
    top = [layout(line) for line in capture("nvidia-smi-q-h100-580.txt").splitlines()
           if line.startswith("Attached GPUs")]
    assert top[0] in [layout(line) for line in query(node).splitlines()]


def raw(node, address):
    with open(node.device_path(address, "numa_node")) as handle:
        return handle.read()


def test_pfs_and_vfs_have_numa_node_as_the_kernel_prints_it(gpusim_node):
    node = gpusim_node("l40s:3,nic:1")
    pfs = node.pfs()
    form = re.compile(r"^-?\d+\n\Z")
    assert form.match(capture("sysfs-numa-node.txt"))
    numa = [raw(node, pf) for pf in pfs]
    assert all(form.match(text) for text in numa)
    assert [int(text) for text in numa] == [0, 0, 1, 1]       # two sockets, the first half on node 0
    sriov_manage(node, "-e", pfs[2])
    vfs = node.vfs(pfs[2])
    assert vfs and all(raw(node, vf) == "1\n" for vf in vfs)


def keyed_lines(text):
    """{(section path, key): (colon column, value)} of an `nvidia-smi -q` output's first GPU."""
    found, path = {}, []
    for line in text.split("GPU 0000", 1)[1].splitlines()[1:]:
        if line.startswith("GPU "):
            break
        depth = (len(line) - len(line.lstrip())) // 4
        key, sep, value = line.partition(":")
        if not line.strip():
            continue
        path[depth - 1:] = [key.strip()]
        if sep:
            found[tuple(path)] = (len(key), value.strip())
    return found


def test_a_passed_through_h100_prints_what_the_real_one_prints(gpusim_node):
    """h100-guest is the H100 80GB HBM3 the capture came from: every line gpusim prints for it is in the
    real output, under the same section, at the same column, with the same value."""
    node = gpusim_node("h100-guest:1")
    real = keyed_lines(capture("nvidia-smi-q-h100-580.txt"))
    ours = keyed_lines(query(node))
    assert ours and set(ours) <= set(real), sorted(set(ours) - set(real))
    for key, (column, value) in ours.items():
        assert (column, value) == real[key], key
    assert ours[("GPU Virtualization Mode", "Virtualization Mode")] == (55, "Pass-Through")


def test_a_vgpu_host_says_host_vgpu_in_the_real_layout(gpusim_node):
    node = gpusim_node("l40s:1,t4:1")
    real = keyed_lines(capture("nvidia-smi-q-h100-580.txt"))
    for gpu in query(node).split("\nGPU ")[1:]:
        ours = keyed_lines("GPU " + gpu)
        assert ours[("GPU Virtualization Mode", "Virtualization Mode")][1] == "Host VGPU"
        shared = set(ours) & set(real)
        assert ("MIG Mode", "Current") in shared and all(ours[key][0] == real[key][0] for key in shared)
    host_modes = [keyed_lines("GPU " + gpu)[("GPU Virtualization Mode", "Host VGPU Mode")][1]
                  for gpu in query(node).split("\nGPU ")[1:]]
    assert host_modes == ["SR-IOV", "Non SR-IOV"]          # L40S VFs; T4 mdevs on the PF


def test_mig_lgip_is_the_real_table_byte_for_byte(gpusim_node):
    """Driver 580 lists the profiles with MIG mode off too, every instance free."""
    node = gpusim_node("h100-guest:1")
    out = subprocess.run(["nvidia-smi", "mig", "-lgip"], env=node.env, capture_output=True, text=True, check=True)
    assert "Disabled" in dict(mig_sections(query(node)))["00000000:41:00.0"][1]
    assert out.stdout == capture("nvidia-smi-mig-lgip-h100.txt")


def test_the_h100_pci_identity_is_the_captured_one(gpusim_node):
    """sysfs attributes gpusim has for the PF equal the real H100's; like the real guest, no sriov_* files."""
    node = gpusim_node("h100-guest:1")
    pf = node.pfs()[0]
    real = dict(line.split("\t", 1) for line in capture("sysfs-pf-h100-guest.txt").splitlines()
                if line and not line.startswith("#"))
    for name in ("vendor", "device", "class", "subsystem_vendor", "subsystem_device", "driver_override"):
        with open(node.device_path(pf, name)) as handle:
            assert handle.read().strip() == real[name], name
    assert os.path.basename(os.readlink(node.device_path(pf, "driver"))) == os.path.basename(real["driver ->"])
    assert not [name for name in os.listdir(node.device_path(pf, "")) if name.startswith("sriov_")]
