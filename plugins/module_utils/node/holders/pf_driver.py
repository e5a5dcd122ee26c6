# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which physical functions the engine may give VFs or vGPUs: a GPU passed through whole stays as it is.

Enabling VFs on an NVIDIA GPU moves it between drivers (sriov-manage unbinds the PF, binds it to
pci-pf-stub, writes sriov_numvfs, binds it back to nvidia: NVIDIA's `/usr/lib/nvidia/sriov-manage`), so a GPU an
administrator bound to vfio-pci for whole-GPU passthrough would be taken from its VM, or silently turned into a
vGPU host. Rule (docs/design.md "Passthrough GPUs"), one answer for vgpu_layout/vgpu_apply (the modules, the
node CLI, the agent, the boot unit), sriov_vfs and vgpu_facts:

- an NVIDIA PF is the engine's while it is bound to `nvidia`, the vGPU host driver. Bound to any other
  driver (vfio-pci, pci-stub, nouveau...) it is *reserved*. With no driver bound it is reserved too
  while the nvidia module is loaded (someone unbound it: nvidia would have probed it); while nvidia is
  not loaded at all it is not reserved, and the vGPU paths fail as before ("is the NVIDIA vGPU host
  driver loaded?"), so a node without its driver never reports success;
- any other SR-IOV PF (a NIC, another vendor's GPU; sriov_vfs only) is the engine's while bound to its
  own driver, i.e. any driver that is not a passthrough stub (vfio-pci, pci-stub, pci-pf-stub); bound to
  a stub, or to none, it is reserved.

A reserved PF is never unbound, rebound, given VFs or vGPUs by `devices: all` (or a filter): it is
reported as skipped with the reason. A `devices` entry that names it (address or GPU index) is a one-line
error. The only way to take one is the documented opt-in `take_over` (a list of PF addresses; module
option `take_over`, CLI `--take-over`): the engine then treats the PF as its own, after checking that
no process holds the PF's VFIO group (`inuse.held_devices`, every holder source, probed when the /proc
scan is incomplete).

A GPU that a DRA claim holds whole (issue 42: our Prepare bound it to vfio-pci, its VFs off; the checkpoint
says so, claim_holders.held_whole) is not reserved but HELD: whoever passes `whole` (that mapping) gets, for such a
PF, a reason naming the claim, whatever driver it is on (after a reboot it is back on nvidia without VFs until the
kubelet prepares the claim again) and whatever `take_over` says: sriov_vfs skips it (or refuses it when named),
never enabling its VFs or rebinding it; vgpu_facts reports it `held_whole`, not `reserved`.

API: `reserved(sysfs, dev, take_over, whole) -> reason or None`; `Skipped(address, driver, reason)`;
`check_take_over(...)`.
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError

HOST_DRIVER = "nvidia"
STUB_DRIVERS = ("vfio-pci", "pci-stub", "pci-pf-stub")
NVIDIA_MODULE = "module/nvidia"


class ReservedError(EngineError):
    """A PF named explicitly that is reserved (passthrough), or a take-over that cannot be done."""


class Skipped(namedtuple("Skipped", "address driver reason")):
    """A PF `devices: all` would have selected, left alone: the driver it is bound to and why."""

    __slots__ = ()

    def to_dict(self):
        return OrderedDict([("address", self.address), ("driver", self.driver), ("reason", self.reason)])

    def line(self):
        return "%s: skipped: %s" % (self.address, self.reason)


def held_whole(address, whole):
    """Why PF `address` is held by a DRA claim given it whole (`whole`: claim_holders.held_whole), or None."""
    if address not in (whole or {}):
        return None
    holder, record = whole[address]
    return "given whole to %s (step %s) by the DRA driver; held until that claim is unprepared" % (
        holder, record.get("step"))


def reserved(sysfs, dev, take_over=(), whole=None):
    """Why the PF `dev` (a pci.PciDevice) is not the engine's, or None when it is (module docstring); `whole`:
    claim_holders.held_whole, whose PFs are held whatever their driver and `take_over`."""
    why = held_whole(dev.address, whole)
    if why is not None:
        return why
    if dev.address in take_over:
        return None
    driver = dev.driver
    if dev.vendor == pci.NVIDIA_VENDOR:
        if driver == HOST_DRIVER:
            return None
        if driver is None:
            if not sysfs.isdir(NVIDIA_MODULE):
                return None         # no vGPU host driver at all: the vGPU paths explain that
            return "no driver bound while the vGPU host driver %s is loaded (reserved, e.g. for passthrough)" \
                % HOST_DRIVER
        return "bound to %s, not to the vGPU host driver %s (%s)" % (
            driver, HOST_DRIVER, "reserved for whole-GPU passthrough" if driver in STUB_DRIVERS else "reserved")
    if driver is None:
        return "no driver bound (reserved)"
    if driver in STUB_DRIVERS:
        return "bound to %s (reserved for passthrough)" % driver
    return None


def skipped(sysfs, devs, take_over=(), whole=None):
    """[Skipped] of the PciDevices that are reserved or held whole, in the given order."""
    found = []
    for dev in devs:
        why = reserved(sysfs, dev, take_over, whole)
        if why is not None:
            found.append(Skipped(dev.address, dev.driver, why))
    return found


def named_error(address, why, how="devices", whole=None):
    """The one-line error for a reserved PF a `devices` entry names (held whole, in `whole`: no take_over takes it)."""
    if address in (whole or {}):
        return ReservedError("%s: %s is %s; its VFs and driver are left alone" % (how, address, why))
    return ReservedError("%s: %s is %s; it is left alone (take_over, on the CLI --take-over, lets the engine rebind it)"
                         % (how, address, why))


def check_take_over(sysfs, addresses, held):
    """Refuse to take over a PF whose VFIO group (or a VF's, an mdev's of it) a process or a source holds.

    `held`: the inuse.held_devices() mapping, a callable returning it, or an inuse.Holders (asked with these PFs
    in scope)."""
    if not addresses:
        return
    if isinstance(held, inuse.Holders):
        found = held.held(list(addresses))
    else:
        found = held() if callable(held) else held
    parents = inuse.mdev_parents(sysfs)
    for address in addresses:
        dev = pci.PciDevice(sysfs, address)
        names = [address] + dev.virtfns()
        for name in names:
            holders = inuse.holders(found, name, parents)
            if holders:
                raise ReservedError("take_over: %s is held (%s%s); not rebinding a GPU a VM uses"
                                    % (address, "" if name == address else "VF %s: " % name,
                                       inuse.describe(holders)), held=[name])
