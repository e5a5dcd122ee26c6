"""Property: our KubeVirt permittedHostDevices merge never loses, duplicates or reorders other
teams' entries (kubevirt.plan_host_devices, the pure merge behind kubevirt_hostdevices).

200 generated CR states (derandomized: the same 200 on every run) with foreign PCI and mdev
entries (other vendors, extra keys, repeated names), some of our entries already present (maybe
stale), and a desired set of ours, present or absent, with or without exclusive NVIDIA handling.
"""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from ansible_collections.accelops.vgpu.tests.fakes.kube_api_rules import merge_patch
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.kubevirt import (
    MDEV, PCI, KubeVirtError, plan_host_devices)

OURS = ["nvidia.com/NVIDIA_L40S-24Q", "nvidia.com/NVIDIA_L40S-12Q", "nvidia.com/NVIDIA_A16-4Q", "nvidia.com/GRID_T4-4Q"]
DEVICES = dict(zip(OURS, ["26B9", "26B5", "25B6", "1EB8"]))  # one PCI ID per resource: one owner per device
FOREIGN_VENDORS = ["8086", "15B3", "1002", "14E4"]   # never NVIDIA: exclusive 10DE must keep them

hex4 = st.text("0123456789ABCDEF", min_size=4, max_size=4)
foreign_name = st.builds("{}/{}".format, st.sampled_from(["intel.com", "mellanox.com", "amd.com", "example.org"]),
                         st.text("abcdefgh-_0123", min_size=1, max_size=8))
extra_keys = st.dictionaries(st.sampled_from(["externalResourceProvider", "team", "note"]),
                             st.one_of(st.booleans(), st.text(max_size=5)), max_size=2)
foreign_pci = st.builds(
    lambda name, vendor, device, extra: dict(extra, resourceName=name, pciVendorSelector="%s:%s" % (vendor, device)),
    foreign_name, st.sampled_from(FOREIGN_VENDORS), hex4, extra_keys)
foreign_mdev = st.builds(lambda name, selector, extra: dict(extra, resourceName=name, mdevNameSelector=selector),
                         foreign_name, st.sampled_from(["i915-GVTg_V5_4", "i915-GVTg_V5_8", "mlx5_sf"]), extra_keys)
stale_ours = st.builds(lambda name, device: {"resourceName": name, "pciVendorSelector": "10DE:%s" % device},
                       st.sampled_from(OURS), st.one_of(hex4, st.sampled_from(sorted(DEVICES.values()))))


def desired_entry(name):
    return {"resourceName": name, "pciVendorSelector": "10DE:" + DEVICES[name]}


def desired_mdev(name):
    return {"resourceName": name, "mdevNameSelector": name.split("/", 1)[1].replace("_", " ", 1)}


@st.composite
def cr_states(draw):
    """(CR, desired pci, desired mdev, state, exclusive) with foreign entries interleaved with ours."""
    pci = draw(st.lists(st.one_of(foreign_pci, foreign_pci, stale_ours), max_size=8))
    mdev = draw(st.lists(foreign_mdev, max_size=5))
    cr = {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
          "metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "7"},
          "spec": {"configuration": {"permittedHostDevices": {PCI: pci, MDEV: mdev},
                                     "developerConfiguration": {"featureGates": draw(
                                         st.lists(st.sampled_from(["LiveMigration", "GPU", "Snapshot"]),
                                                  unique=True))}}}}
    names = draw(st.lists(st.sampled_from(OURS), unique=True, max_size=len(OURS)))
    split = draw(st.integers(0, len(names)))
    return (cr, [desired_entry(n) for n in names[:split]], [desired_mdev(n) for n in names[split:]],
            draw(st.sampled_from(["present", "absent"])), draw(st.booleans()))


def takes_devices_of_ours(cr, pci):
    """A foreign (not desired) entry in the CR with the selector of a desired one."""
    wanted = dict((e["pciVendorSelector"].upper(), e["resourceName"]) for e in pci)
    names = set(wanted.values())
    return any(e["resourceName"] not in names and e["pciVendorSelector"].upper() in wanted
               for e in cr["spec"]["configuration"]["permittedHostDevices"][PCI])


def stored_after(cr, plan):
    """The CR as the API server stores it after our JSON merge patch (metadata and spec alike)."""
    return merge_patch(cr, plan.patch or {})


def foreign(entries, ours):
    return [e for e in entries if e.get("resourceName") not in ours]


@pytest.mark.no_failure_path("a property of the planner: a pure function, no I/O")
@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(cr_states())
def test_merges_keep_foreign_entries_complete_unique_and_in_order(state):
    cr, pci, mdev, wanted_state, exclusive = state
    original = copy.deepcopy(cr)
    if wanted_state == "present" and not exclusive and takes_devices_of_ours(cr, pci):
        with pytest.raises(KubeVirtError, match="is permitted as .* and would also be as"):
            plan_host_devices(cr, pci, mdev, wanted_state)  # one device, one owner: refused before any write
        return
    plan = plan_host_devices(cr, pci, mdev, wanted_state, exclusive_pci_vendors=["10DE"] if exclusive else (),
                             exclusive_mdev_prefixes=["NVIDIA", "GRID"] if exclusive else ())
    assert cr == original  # pure: the CR as read is not modified
    after = stored_after(cr, plan)["spec"]["configuration"]
    for kind, desired in ((PCI, pci), (MDEV, mdev)):
        ours = set(e["resourceName"] for e in desired)
        before_list = original["spec"]["configuration"]["permittedHostDevices"][kind]
        after_list = after["permittedHostDevices"][kind]
        kept = [e for e in foreign(before_list, ours)
                if not (exclusive and kind == PCI and e["pciVendorSelector"].startswith("10DE:"))]
        assert foreign(after_list, ours) == kept   # none lost, none duplicated, same order, same content
        mine = [e for e in after_list if e.get("resourceName") in ours]
        # ours: once each with the desired fields (updated in place or appended), or gone when absent
        assert sorted(e["resourceName"] for e in mine) == (sorted(ours) if wanted_state == "present" else [])
        assert all(dict(e, **d) == e for e in mine for d in desired if d["resourceName"] == e["resourceName"])
    gates = original["spec"]["configuration"]["developerConfiguration"]["featureGates"]
    assert after["developerConfiguration"]["featureGates"][:len(gates)] == gates
    again = plan_host_devices(stored_after(cr, plan), pci, mdev, wanted_state,
                              exclusive_pci_vendors=["10DE"] if exclusive else (),
                              exclusive_mdev_prefixes=["NVIDIA", "GRID"] if exclusive else ())
    assert again.patch is None, again.changes  # and a second run changes nothing
