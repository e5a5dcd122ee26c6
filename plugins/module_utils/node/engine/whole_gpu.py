# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A claim-time GPU given whole to one DRA claim (issue 42 item 1): the node-side steps and their record.

The DRA driver (kubelet/dra/whole_gpu.py, WholeGpuPreparer) runs these under the node lock. Every step is recorded in the
claim's checkpoint record (`devices[].whole.step`, written durably) BEFORE it is taken, so a crash at any point is
found on restart and each step is idempotent (it checks sysfs first):

  Prepare  (forward, or back when the claim is gone: driver.clean_stale, or unprepared)
    STEP_DISABLE  the GPU's VFs go (the sriov engine: sriov-manage -d, verified; refused while a VF is held)
    STEP_BIND     the PF moves nvidia -> vfio-pci: driver_override, unbind, bind, verified (`driver` link)
    STEP_BOUND    done: the PF is the claim's (CDI spec with its VFIO group, KEP-5304 pciBusID = the PF)
  Unprepare (always forward, back to vGPUs: the kubelet retries an unprepare that failed)
    STEP_RETURN   the PF moves vfio-pci -> nvidia: override cleared, unbind, bind nvidia, verified
    STEP_ENABLE   the GPU's VFs again (sriov-manage -e, verified); then the record goes with the claim's

Linux rules followed (Documentation/ABI/testing/sysfs-bus-pci `driver_override`, drivers/pci/pci-driver.c): with
driver_override set only that driver binds the device; an empty write clears it. The PF is never unbound with VFs
enabled (nvidia's remove takes them down under any VM; sriov-manage disables them first for the same reason).

A PF that a record says a claim holds whole is this driver's, not an operator's reservation (node/holders/pf_driver.py):
node/holders/claim_holders.held_whole names those PFs; the reconcile (claim_time_layout.plan), vgpu_facts and
sriov_vfs neither touch nor report them reserved.
A reboot leaves the PF on nvidia without VFs and the record in place: the kubelet prepares the claim again
(STEP_DISABLE finds no VF, STEP_BIND rebinds) or unprepares it (VFs enabled again). A record of an earlier boot
never explains a PF off nvidia: someone else bound it since the reboot; it is neither taken nor rebound.
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci, vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, inuse

HOST_DRIVER, VFIO_DRIVER = "nvidia", "vfio-pci"
VFIO_DRIVER_DIR = "bus/pci/drivers/" + VFIO_DRIVER     # present while the module is loaded
STEP_CHECKED, STEP_DISABLE, STEP_BIND, STEP_BOUND = "checked", "disable-vfs", "bind-vfio", "bound"
STEP_RETURN, STEP_ENABLE = "bind-nvidia", "enable-vfs"
PREPARE_STEPS = (STEP_CHECKED, STEP_DISABLE, STEP_BIND, STEP_BOUND)


class WholeGpuError(EngineError):
    """A whole-GPU step that cannot be taken; the message names the GPU."""


def busy(sysfs, pf, found, mine=()):
    """Why GPU `pf` cannot be given whole now, or None: a VF with a vGPU type, or a holder (`found`:
    inuse.held_devices over the PF and its VFs: VMs, prepared claims, device plugin allocations) other than
    `mine`; the PF bound to another driver than nvidia that no record of this claim explains."""
    dev = pci.PciDevice(sysfs, pf)
    parents = inuse.mdev_parents(sysfs)
    for name in [pf] + dev.virtfns():
        holders = [h for h in inuse.holders(found, name, parents) if h not in mine]
        if holders:
            return "%s is held by %s" % ("the PF" if name == pf else "VF %s" % name, inuse.describe(holders))
        if name != pf:
            try:
                current = vgpu_types.read_current(sysfs, name)
            except (SysfsError, ValueError):
                current = None
            if current is None:
                return "the vGPU type of VF %s cannot be read (unknown is held)" % name
            if current:
                return "VF %s has vGPU type %d" % (name, current)
    return None


def bind(sysfs, pf, driver):
    """Move the PF to `driver` (driver_override, unbind, bind) and verify its `driver` link; nothing when it is
    there already. The override of nvidia is cleared (an empty write), so that nvidia binds it as before."""
    dev = pci.PciDevice(sysfs, pf)
    if dev.driver == driver:
        _override(sysfs, pf, "" if driver == HOST_DRIVER else driver)
        return
    try:
        _override(sysfs, pf, "" if driver == HOST_DRIVER else driver)
        if dev.driver:
            sysfs.write("bus/pci/drivers/%s/unbind" % dev.driver, pf)
        sysfs.write("bus/pci/drivers/%s/bind" % driver, pf)
    except SysfsError as exc:
        raise WholeGpuError("GPU %s: cannot bind it to %s: %s" % (pf, driver, exc)) from None
    now = dev.driver
    if now != driver:
        raise WholeGpuError("GPU %s: bound to %s after the bind to %s" % (pf, now or "no driver", driver))


def _override(sysfs, pf, driver):
    path = "%s/%s/driver_override" % (pci.PCI_DEVICES, pf)
    if (sysfs.read_optional(path) or "").strip() in ((driver,) if driver else ("", "(null)")):
        return
    sysfs.write(path, driver or "\n")


def take(sysfs, pf, set_vfs, step):
    """Prepare's steps (module docstring) from wherever an earlier, cut-short prepare left them; `step(name)` records
    the step durably before it is taken; `set_vfs(pf, count)` is the sriov engine's verified change."""
    if pci.PciDevice(sysfs, pf).driver != VFIO_DRIVER:
        if pci.PciDevice(sysfs, pf).sriov_numvfs:
            step(STEP_DISABLE)
            set_vfs(pf, 0)
        step(STEP_BIND)
        bind(sysfs, pf, VFIO_DRIVER)
    step(STEP_BOUND)


def give_back(sysfs, pf, set_vfs, step, found, ours=True):
    """Unprepare's steps: back to nvidia, the VFs enabled again and verified. `found`: inuse.held_devices of the PF:
    a VM that still has its VFIO group open keeps it (the unbind would block until it lets go): an error.
    `ours` False (the record is of an earlier boot): a reboot put the PF back on nvidia, so a PF on another driver now
    was bound by someone else (an operator, the GPU Operator's vfio-manager, another DRA driver): left as it is."""
    dev = pci.PciDevice(sysfs, pf)
    if dev.driver != HOST_DRIVER and not ours:
        return
    if dev.driver != HOST_DRIVER:
        holders = [h for h in inuse.holders(found, pf, {}) if not claim_holders.is_claim_holder(h)]
        if holders:
            raise WholeGpuError("GPU %s: still held by %s; not given back to %s"
                                % (pf, inuse.describe(holders), HOST_DRIVER))
        step(STEP_RETURN)
        bind(sysfs, pf, HOST_DRIVER)
    if not dev.sriov_numvfs:
        step(STEP_ENABLE)
        set_vfs(pf, "max")
