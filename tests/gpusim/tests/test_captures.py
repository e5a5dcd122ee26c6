"""gpusim against reference output (captures/README.md names the sources): the `MIG Mode` section of
`nvidia-smi -q` and the `numa_node` file of PFs and VFs."""

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
    reference = mig_sections(capture("nvidia-smi-q-mig.txt"))[0][1]
    sections = dict(mig_sections(query(node)))
    assert sorted(sections) == ["00000000:41:00.0", "00000000:42:00.0"]
    for gpu, lines in sections.items():
        assert [layout(line) for line in lines] == [layout(line) for line in reference], gpu
    assert values(sections["00000000:41:00.0"]) == ["Disabled", "Disabled"]
    assert values(sections["00000000:42:00.0"]) == ["N/A", "N/A"]          # no MIG on Ada (nvidia-smi(1))
    node.ctl("mig", h100, "1")
    assert values(dict(mig_sections(query(node)))["00000000:41:00.0"]) == ["Enabled", "Enabled"]
    # the top-level lines keep the capture's colon column too
    top = [layout(line) for line in capture("nvidia-smi-q-mig.txt").splitlines() if line.startswith("Attached GPUs")]
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
