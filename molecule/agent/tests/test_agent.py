# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent in its container converged the simulated node to the label's layout; a relabel
converges it again. Its device plugin serves the test kubelet (molecule/agent/kubelet.py), which writes the
Node's status.allocatable into the emulator: it follows the relabel. Sysfs is read through the node container (the same gpusim tree), labels from the
API emulator; expected type IDs come from gpusim's model catalogue, never from the agent."""

from __future__ import annotations

import collections
import json
import os
import shlex
import time
import urllib.request

import yaml
from gpusim.models import MODELS

PROJECT = os.environ["MOLECULE_PROJECT_DIRECTORY"]
STATE_DIR = os.path.join(PROJECT, ".build", "molecule", "agent")
NODE = "vgpu-mol-agent"
with open(os.path.join(PROJECT, "molecule", "shared", "group_vars", "vgpu_nodes.yml"), encoding="utf-8") as handle:
    CONFIGS = yaml.safe_load(handle)["vgpu_profiles_configs"]
TYPE_IDS = {t.short_name: t.type_id for model in MODELS.values() for t in model.types}
L40S = "0000:41:00.0"

# Inside the node container: the L40S VFs' current_vgpu_type and the T4's mdev types.
NODE_STATE = r"""
import json, os
root = "/host/sys/bus/pci/devices"
def read(*p):
    with open(os.path.join(*p)) as h:
        return h.read().strip()
pf = os.path.join(root, "%s")
vfs = sorted(os.path.basename(os.readlink(os.path.join(pf, n))) for n in os.listdir(pf) if n.startswith("virtfn"))
types = [read(root, vf, "nvidia", "current_vgpu_type") for vf in vfs]
mdevs = []
for address in os.listdir(root):
    for name in os.listdir(os.path.join(root, address)):
        if len(name) == 36 and os.path.isdir(os.path.join(root, address, name, "mdev_type")):
            mdevs.append(os.path.basename(os.readlink(os.path.join(root, address, name, "mdev_type"))))
print(json.dumps({"vfs": len(vfs), "types": types, "mdevs": mdevs}))
""" % L40S


def api(path, patch=None):
    with open(os.path.join(STATE_DIR, "kubeconfig"), encoding="utf-8") as handle:
        server = json.load(handle)["clusters"][0]["cluster"]["server"]
    request = urllib.request.Request(server + path, method="PATCH" if patch else "GET",
                                     data=json.dumps(patch).encode() if patch else None,
                                     headers={"Content-Type": "application/merge-patch+json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def labels():
    return api("/api/v1/nodes/" + NODE)["metadata"]["labels"]


def node_state(host):
    return json.loads(host.check_output("python3 -c %s" % shlex.quote(NODE_STATE)))


def expected_l40s(config):
    profiles = [e["profiles"] for e in CONFIGS[config] if e.get("device_filter") == "0x26B910DE"][0]
    return collections.Counter({str(TYPE_IDS[name]): count for name, count in profiles.items()})


def assert_layout(host, config):
    state = node_state(host)
    assert state["vfs"] > 0
    programmed = collections.Counter(t for t in state["types"] if t != "0")
    assert programmed == expected_l40s(config)
    t4 = [e["profiles"] for e in CONFIGS[config] if e.get("device_filter") == "0x1EB810DE"][0]
    assert len(state["mdevs"]) == sum(t4.values())
    current = labels()
    assert current["nvidia.com/vgpu.config"] == config and current["nvidia.com/vgpu.config.state"] == "success"
    # one label per profile in use, with its count; the previous layout's label is gone
    wanted = {"accelops.io/vgpu.profile." + name: str(count) for entry in CONFIGS[config]
              if entry.get("device_filter") == "0x26B910DE" for name, count in entry["profiles"].items()}
    assert {k: v for k, v in current.items() if k.startswith("accelops.io/vgpu.profile.L40S")} == wanted


def relabel_and_wait(config, timeout=120):
    api("/api/v1/nodes/" + NODE, {"metadata": {"labels": {"nvidia.com/vgpu.config": config}}})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = labels()
        if current.get("nvidia.com/vgpu.config.state") == "success":
            profiles = {k for k in current if k.startswith("accelops.io/vgpu.profile.L40S")}
            wanted = {"accelops.io/vgpu.profile." + n for e in CONFIGS[config]
                      if e.get("device_filter") == "0x26B910DE" for n in e["profiles"]}
            if profiles == wanted:
                return
        time.sleep(0.5)
    raise AssertionError("the agent did not converge %s to %s: %s" % (NODE, config, labels()))


def test_converge_label_layout_is_on_the_node(host):
    assert_layout(host, "large")


def test_relabel_converges_the_node_and_back(host):
    relabel_and_wait("fleet")
    assert_layout(host, "fleet")
    relabel_and_wait("large")
    assert_layout(host, "large")


# the type names gpusim's drivers give these profiles: vendor-specific VFIO "NVIDIA ...", the T4's mdev "GRID ..."
RESOURCE_PREFIX = {"0x26B910DE": "nvidia.com/NVIDIA_", "0x1EB810DE": "nvidia.com/GRID_"}


def expected_allocatable(config):
    """{resource: count} the node's one L40S and one T4 get from `config`, as the kubelet counts them."""
    return {RESOURCE_PREFIX[e["device_filter"]] + name: str(count) for e in CONFIGS[config]
            if e.get("device_filter") in RESOURCE_PREFIX for name, count in e["profiles"].items()}


def allocatable_becomes(config, timeout=60):
    wanted = expected_allocatable(config)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = (api("/api/v1/nodes/" + NODE).get("status") or {}).get("allocatable") or {}
        if {k: v for k, v in current.items() if k.startswith("nvidia.com/")} == wanted:
            return
        time.sleep(0.5)
    raise AssertionError("status.allocatable of %s is not %s: %s" % (NODE, wanted, current))


def test_the_kubelet_gets_the_vgpus_from_the_agents_device_plugin_and_they_follow_a_relabel(host):
    allocatable_becomes("large")
    relabel_and_wait("fleet")
    allocatable_becomes("fleet")
    relabel_and_wait("large")
    allocatable_becomes("large")
