# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rules and messages for a `devices` list, shared by sriov_vfs (sriov.select_pfs) and the vGPU
layouts (vgpu_layout: the module, the node CLI and the agent), so one input gets one answer:

- one device given twice, in any spelling (`41:00.0`, `0000:41:00.0`, `0000:41:00.0 ` or, in a
  layout, its GPU index), is an error: `devices: '41:00.0' and '0000:41:00.0' select the same
  devices` when the spellings normalise alike, else `devices: <address> is selected twice (by ..
  and ..)`;
- an address that is not there: `devices: no PCI device <address> on this node`;
- a VF: `devices: <VF> is a VF of <PF>; select its physical function`.
Callers turn SelectionError into their own error class (SriovError, LayoutError), adding where the
list came from (`layout[0]: `).
"""

from __future__ import annotations

from collections import OrderedDict

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.pci import PciDevice


class SelectionError(EngineError):
    """A `devices` entry that selects nothing usable, or a device selected twice."""


class Selection:
    """What one `devices` list selects, in the order given; refuses anything selected twice."""

    def __init__(self):
        self._spellings = {}             # normalised item -> the item as given
        self.chosen = OrderedDict()      # address -> the item that selected it

    def spelling(self, key, item):
        """Note an item by its normalised form (address, index, vendor:device)."""
        if key in self._spellings:
            raise SelectionError("devices: %r and %r select the same devices" % (self._spellings[key], item))
        self._spellings[key] = item

    def choose(self, address, item):
        """Note a device `item` selects."""
        if address in self.chosen:
            raise SelectionError("devices: %s is selected twice (by %r and %r)" % (address, self.chosen[address], item))
        self.chosen[address] = item


def physical_function(sysfs, address):
    """The PciDevice at a normalised address, which must exist and be a physical function."""
    dev = PciDevice(sysfs, address)
    if not dev.exists:
        raise SelectionError("devices: no PCI device %s on this node" % address)
    if dev.is_vf:
        raise SelectionError("devices: %s is a VF of %s; select its physical function" % (address, dev.physfn))
    return dev
