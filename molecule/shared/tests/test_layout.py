# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each node carries the layout of group_vars/vgpu_nodes.yml, read from its simulated sysfs.

Expectations come from the inventory (what the user asked for) and gpusim's model catalogue
(type name -> ID), never from the roles' own output.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shlex

import yaml
from gpusim.models import MODELS

UNIT = "/etc/systemd/system/accelops-vgpu.service"
LAYOUT = "/etc/accelops-vgpu/layout.json"
CLI = "/usr/local/bin/accelops-vgpu"

with open(os.path.join(os.path.dirname(__file__), "..", "group_vars", "vgpu_nodes.yml"), encoding="utf-8") as vars_file:
    NODE_VARS = yaml.safe_load(vars_file)
SELECTED = NODE_VARS["vgpu_profiles_selected"]
TYPE_IDS = {vgpu_type.short_name: vgpu_type.type_id for model in MODELS.values() for vgpu_type in model.all_types}
MIG_BACKED = re.compile(r"^.+-(\d+)-(\d+)C(ME)?$")   # H100-1-20C -> GPU instance 1g.20gb (VDM's conversion)

# Runs inside the node (its python3): every NVIDIA PF with its VF count and the vGPU type IDs on it
# (vendor-VFIO: each VF's current_vgpu_type; mdev: the mdevs below the PF or its VFs).
NODE_STATE = r"""
import json, os
devices = os.path.join(os.environ.get("GPUSIM_ROOT", "/sys"), "bus/pci/devices")

def read(*parts):
    with open(os.path.join(*parts)) as handle:
        return handle.read().strip()

state = {}
for address in sorted(os.listdir(devices)):
    path = os.path.join(devices, address)
    if read(path, "vendor") != "0x10de" or os.path.islink(os.path.join(path, "physfn")):
        continue
    sriov = os.path.exists(os.path.join(path, "sriov_numvfs"))
    pf = {"device": read(path, "device")[2:], "numvfs": int(read(path, "sriov_numvfs")) if sriov else 0,
          "totalvfs": int(read(path, "sriov_totalvfs")) if sriov else 0, "types": []}
    parents = [path] + [os.path.join(path, name) for name in sorted(os.listdir(path)) if name.startswith("virtfn")]
    for parent in parents:
        if os.path.exists(os.path.join(parent, "nvidia", "current_vgpu_type")):
            pf["types"].append(int(read(parent, "nvidia", "current_vgpu_type")))
        mdev_types = os.path.join(parent, "mdev_supported_types")
        for name in sorted(os.listdir(mdev_types)) if os.path.isdir(mdev_types) else []:
            count = len(os.listdir(os.path.join(mdev_types, name, "devices")))
            pf["types"] += [int(name.split("-")[1])] * count
    state[address] = pf
print(json.dumps(state))
"""


_STATES = {}


def node_state(host):
    """The node's GPUs as NODE_STATE reads them, once per node and test session."""
    name = host.backend.get_hostname()
    if name not in _STATES:
        result = host.run("python3 -c %s" % shlex.quote(NODE_STATE))
        assert result.rc == 0, result.stderr
        _STATES[name] = json.loads(result.stdout)
    assert _STATES[name], "no NVIDIA GPU in the simulated tree"
    return _STATES[name]


def expected_profiles(device, label=SELECTED):
    """{profile: instances} the layout asks for on one GPU with this PCI device ID."""
    for entry in NODE_VARS["vgpu_profiles_configs"][label]:
        if entry["device_filter"][2:6].lower() == device:
            return entry["profiles"]
    raise AssertionError("no layout entry for device %s" % device)


def expected_types(device, label=SELECTED):
    """{type ID: instances} the layout asks for on one GPU with this PCI device ID."""
    return {TYPE_IDS[name]: count for name, count in expected_profiles(device, label).items()}


def exec_start(host):
    lines = [line for line in host.file(UNIT).content_string.splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0][len("ExecStart="):])


def test_every_sriov_gpu_has_all_its_vfs(host):
    for address, pf in node_state(host).items():
        assert pf["numvfs"] == pf["totalvfs"], address


def test_every_gpu_carries_the_selected_profiles(host):
    for address, pf in node_state(host).items():
        actual = collections.Counter(type_id for type_id in pf["types"] if type_id)
        assert actual == expected_types(pf["device"]), address


def test_mig_backed_gpus_are_in_mig_mode_with_one_gpu_instance_per_vgpu(host):
    for address, pf in node_state(host).items():
        wanted = sorted("%sg.%sgb%s" % (m.group(1), m.group(2), "+me" if m.group(3) else "")
                        for name, count in expected_profiles(pf["device"]).items()
                        for m in [MIG_BACKED.match(name)] if m for dummy in range(count))
        if not wanted:
            continue
        mode = host.run("nvidia-smi -i %s --query-gpu=mig.mode.current --format=csv,noheader" % address)
        assert mode.stdout.strip() == "Enabled", address
        listed = host.run("nvidia-smi mig -i %s -lgi" % address).stdout
        assert sorted(line.split()[3] for line in listed.splitlines() if " MIG " in line) == wanted, listed


def test_layout_file_is_the_configured_document(host):
    layout = host.file(LAYOUT)
    assert layout.mode == 0o644
    document = json.loads(layout.content_string)
    assert document["vgpu-configs"][SELECTED][0]["vgpu-devices"] == NODE_VARS["vgpu_profiles_configs"][SELECTED][0]["profiles"]


def test_boot_unit_reapplies_the_layout(host):
    unit = host.file(UNIT)
    assert unit.mode == 0o644
    lines = set(unit.content_string.splitlines())
    for line in ("Type=oneshot", "RemainAfterExit=yes", "PartOf=nvidia-vgpu-mgr.service",
                 "After=nvidia-vgpud.service nvidia-vgpu-mgr.service", "Before=kubelet.service",
                 "WantedBy=multi-user.target nvidia-vgpud.service nvidia-vgpu-mgr.service"):
        assert line in lines, line
    argv = exec_start(host)
    assert argv[:4] == [CLI, "apply", "--config", LAYOUT]
    assert host.file(CLI).mode & 0o111


def test_node_cli_asserts_the_layout(host):
    argv = exec_start(host)
    argv[1] = "assert"
    assert host.run(shlex.join(argv)).rc == 0
    other = [label for label in NODE_VARS["vgpu_profiles_configs"] if label != SELECTED][0]
    argv[argv.index("--selected") + 1] = other
    assert host.run(shlex.join(argv)).rc != 0, "assert accepted layout %s too" % other
