# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan and apply SR-IOV VF counts on physical functions (GPUs, and any other SR-IOV PF by address).

Kernel rules (drivers/pci/iov.c, sriov_numvfs_store): more than sriov_totalvfs is ERANGE; a PF
driver without sriov_configure answers ENOENT; going from N to M VFs (both non-zero) is EBUSY, so
it takes N -> 0 -> M. NVIDIA's sriov-manage always enables sriov_totalvfs VFs and can exit 0
without enabling anything (vGPU 17.2), so its result is checked in sysfs and it is retried, as
NVIDIA's gpu-driver-container does (`vgpu-manager/ubuntu24.04/nvidia-driver`, _enable_vfs).

Selection (`devices`): `all` = every SR-IOV PF of PCI base class 0x03 (GPUs; NICs and NVMe are
never selected by `all`, and a node without any is an empty, unchanged plan), or a list of PCI
addresses and vendor/device filters (`0x26B910DE`, `10de:26b9`). A filter matches SR-IOV PFs of any
class. A filter that matches nothing is fine while the list as a whole selects something (one
fleet-wide list for mixed nodes); a list that selects nothing is an error, as is a device selected
twice, an unknown address, a VF or a function without SR-IOV.

Safety: a change that removes existing VFs (N -> 0, N -> M) is refused when any of them is held by
a VM (never overridable) or programmed (a vGPU type set, or an mdev on it) unless `force`. The whole
plan is validated before the first write; PFs are then applied in parallel and verified: the count
is right and every VF is ready (its virtfn link exists; on NVIDIA its `nvidia/` directory or its
`mdev_supported_types` exists).

API (also used by the node CLI):
    plan = plan_vfs(sysfs, runner, devices="all", num_vfs="max", state="present", method="auto",
                    force=False, held=lambda: inuse.held_devices(sysfs, dev_root, proc_root))
    plan.changed; plan.as_list(); plan.diff()      # check mode / diff
    apply_vfs(sysfs, runner, plan, timeout=120)   # writes; raises SriovError naming the PF
sriov-manage is found at /usr/lib/nvidia/sriov-manage, then on PATH; `plan_vfs(...,
sriov_manage_path=...)` names it instead (GPU Operator: /run/nvidia/driver/usr/lib/nvidia/sriov-manage).
`held` is the mapping from inuse.held_devices(), a callable returning it, or an inuse.Holders (then each
PF's VFs are asked of the kernel again right before they are removed); it is only evaluated when a plan
removes existing VFs. Callers hold node_lock around plan + apply.
"""

from __future__ import annotations

import errno
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import List, Optional

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci, vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse, pf_driver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import device_selection
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, shown
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.vgpu_writer import VgpuWriter, attempt

SRIOV_MANAGE = "sriov-manage"
SRIOV_MANAGE_PATHS = ("/usr/lib/nvidia/sriov-manage",)
METHODS = ("auto", "sysfs", "sriov_manage")
STATES = ("present", "absent")
MAX_WORDS = ("max", "total")


class SriovError(EngineError):
    """A VF count that cannot be planned or applied; the message names the PF (or VF, or input)."""


@dataclass
class PfPlan:
    """Current -> desired VF count of one PF, and how it will get there."""

    address: str
    vendor: Optional[str]
    device: Optional[str]
    total_vfs: int
    current: int
    desired: int
    method: str                     # "sysfs" or "sriov_manage"
    tool: Optional[str] = None      # sriov-manage path when method is sriov_manage
    discard: List[str] = field(default_factory=list)   # VFs whose vGPU/mdev force discards
    recheck: Optional[object] = field(default=None, repr=False, compare=False)  # inuse.Holders.recheck

    @property
    def changed(self):
        return self.current != self.desired

    @property
    def nvidia(self):
        return self.vendor == pci.NVIDIA_VENDOR

    def as_dict(self):
        return {"address": self.address, "before": {"num_vfs": self.current},
                "after": {"num_vfs": self.desired}, "method": self.method, "changed": self.changed,
                "discarded_profiles": list(self.discard)}


@dataclass
class SriovPlan:
    pfs: List[PfPlan]
    skipped: List = field(default_factory=list)    # pf_driver.Skipped: PFs passed through, left alone

    @property
    def changed(self):
        return any(p.changed for p in self.pfs)

    def as_list(self):
        return [p.as_dict() for p in self.pfs]

    def diff(self):
        """Ansible diff: the VF count of every PF that changes, before and after."""
        moving = [p for p in self.pfs if p.changed]
        return {"before": dict((p.address, {"num_vfs": p.current}) for p in moving),
                "after": dict((p.address, {"num_vfs": p.desired}) for p in moving)}


def parse_num_vfs(value):
    """`max`/`total` -> None (= sriov_totalvfs), else a non-negative integer."""
    if isinstance(value, str) and value.strip().lower() in MAX_WORDS:
        return None
    if not isinstance(value, bool):
        try:
            number = int(str(value).strip(), 10)
        except ValueError:
            number = -1
        if number >= 0:
            return number
    raise SriovError("num_vfs %r is not a number of VFs or 'max'" % str(value)[:40])


def _as_items(devices):
    if devices is None:
        return ["all"]
    if isinstance(devices, str):
        return [devices]
    return [str(item).strip() for item in devices]


def _sriov_pfs(sysfs):
    """Every SR-IOV capable physical function, in address order."""
    found = []
    for address in pci.list_addresses(sysfs):
        dev = pci.PciDevice(sysfs, address)
        if dev.sriov_capable and not dev.is_vf:
            found.append(dev)
    return found


def _by_address(sysfs, address, take_over=(), whole=None):
    dev = device_selection.physical_function(sysfs, address)
    if not dev.sriov_capable:
        raise SriovError("devices: %s does not support SR-IOV (no sriov_totalvfs)" % address)
    why = pf_driver.reserved(sysfs, dev, take_over, whole)
    if why is not None:
        raise SriovError(str(pf_driver.named_error(address, why, whole=whole)))
    return dev


def _own(sysfs, devs, take_over, skipped, whole=None):
    """The PFs of `devs` the engine may change; the others (passed through, or given whole to a DRA claim) go to
    `skipped` (node/holders/pf_driver.py)."""
    found = pf_driver.skipped(sysfs, devs, take_over, whole)
    if skipped is not None:
        skipped.extend(found)
    gone = set(s.address for s in found)
    return [dev for dev in devs if dev.address not in gone]


def select_pfs(sysfs, devices="all", take_over=(), skipped=None, whole=None):
    """`devices` -> [PciDevice] of the selected PFs, in address order (see the module docstring).
    A PF passed through (pf_driver.reserved) is left out and added to the list `skipped` when `all` or a
    filter selects it, and an error when its address is listed (unless `take_over` lists it). A PF a DRA claim
    holds whole (`whole`: claim_holders.held_whole) likewise, whatever its driver and `take_over`."""
    items = _as_items(devices)
    if any(item.lower() == "all" for item in items):
        if len(items) != 1:
            raise SriovError("devices: 'all' cannot be combined with other entries (%s)" % ", ".join(map(shown, items)))
        return _own(sysfs, [dev for dev in _sriov_pfs(sysfs) if dev.is_display], take_over, skipped, whole)
    if not items:
        raise SriovError("devices: the list is empty; give 'all', PCI addresses or vendor/device filters")
    try:
        return _select_listed(sysfs, items, take_over, [] if skipped is None else skipped, whole)
    except device_selection.SelectionError as err:
        raise SriovError(str(err)) from None


def _select_listed(sysfs, items, take_over=(), skipped=None, whole=None):
    """Addresses and filters -> PFs, by device_selection's rules (shared with the vGPU layouts)."""
    selection, devices, candidates = device_selection.Selection(), {}, None
    for item in items:
        try:
            key, matches = pci.parse_address(item), None
        except pci.PciAddressError:
            try:
                vendor, device = pci.parse_id_filter(item)
            except pci.PciAddressError:
                raise SriovError("devices: %r is neither a PCI address nor a vendor/device filter "
                                 "(0x26B910DE or 10de:26b9)" % item[:64]) from None
            key = "%s:%s" % (vendor, device)
            if candidates is None:
                candidates = _sriov_pfs(sysfs)
            matches = [dev for dev in candidates if dev.id_pair == (vendor, device)]
            matches = _own(sysfs, matches, take_over, skipped, whole)
        selection.spelling(key, item)
        for dev in matches if matches is not None else [_by_address(sysfs, key, take_over, whole)]:
            selection.choose(dev.address, item)
            devices[dev.address] = dev
    if not devices and skipped:
        return []           # every match is passed through: nothing to do, and said so
    if not devices:
        raise SriovError("devices: %s match no SR-IOV physical function on this node" % ", ".join(map(shown, items)))
    return [devices[address] for address in sorted(devices)]


def find_sriov_manage(runner, path=None):
    """The sriov-manage to run: `path` when given (GPU Operator nodes mount the host driver root at
    /run/nvidia/driver, so the tool is /run/nvidia/driver/usr/lib/nvidia/sriov-manage), else
    /usr/lib/nvidia/sriov-manage, else sriov-manage on PATH (None when there is none)."""
    if not path:
        return runner.which(SRIOV_MANAGE, SRIOV_MANAGE_PATHS)
    if not os.path.isabs(path):
        raise SriovError("sriov_manage_path %s: not an absolute path" % shown(path))
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise SriovError("sriov_manage_path %s: no executable file there" % shown(path))
    return path


def _choose_method(dev, method, tool, desired, total):
    chosen = method
    if method == "auto":
        chosen = "sriov_manage" if dev.vendor == pci.NVIDIA_VENDOR and tool else "sysfs"
    if chosen == "sriov_manage":
        if dev.vendor != pci.NVIDIA_VENDOR:
            raise SriovError("%s: method sriov_manage only handles NVIDIA GPUs (vendor 10de, not %s)"
                             % (dev.address, dev.vendor))
        if not tool:
            raise SriovError("%s: sriov-manage not found (looked in %s and PATH)"
                             % (dev.address, ", ".join(SRIOV_MANAGE_PATHS)))
        if desired not in (0, total):
            raise SriovError("%s: sriov-manage always enables all %d VFs; num_vfs %d needs method sysfs"
                             % (dev.address, total, desired))
    return chosen


def _programmed(sysfs, vf, parents):
    """Why a VF counts as programmed (a vGPU type or an mdev), or None."""
    for uuid, parent in sorted(parents.items()):
        if parent == vf:
            return "mdev %s" % uuid
    try:
        current = vgpu_types.read_current(sysfs, vf)
    except SysfsError:
        return "an unreadable current_vgpu_type"
    return "vGPU type %d" % current if current else None


def _check_removals(sysfs, plans, held, force):
    """Refuse to destroy held VFs (always) or programmed VFs (unless force); note what force discards."""
    removing = [p for p in plans if p.changed and p.current]
    if not removing:
        return
    if isinstance(held, inuse.Holders):
        # the walk of /proc this apply already made stands; right before the VFs go, each one's group is
        # asked of the kernel again (_recheck_removal)
        held_now = held.held([p.address for p in removing], reuse=True)
        for plan in removing:
            plan.recheck = held.recheck
    else:
        held_now = held() if callable(held) else held
    if held_now is None:
        raise SriovError("plan_vfs: cannot tell which VFs VMs hold (no held mapping given)")
    parents = inuse.mdev_parents(sysfs)
    for plan in removing:
        for vf in pci.PciDevice(sysfs, plan.address).virtfns():
            pids = inuse.holders(held_now, vf, parents)
            if pids:
                raise _held_error(plan, vf, pids)
            why = _programmed(sysfs, vf, parents)
            if why and not force:
                raise SriovError("%s: VF %s has %s that changing %d -> %d VFs would discard; set force to allow it"
                                 % (plan.address, vf, why, plan.current, plan.desired))
            if why:
                plan.discard.append(vf)


def _held_error(plan, vf, found, since=""):
    return SriovError("%s: VF %s is held by a VM (%s)%s; refusing to change %d -> %d VFs"
                      % (plan.address, vf, inuse.describe(found), since, plan.current, plan.desired), held=[vf])


def _recheck_removal(sysfs, plan):
    """Right before the VFs of a PF are removed: each VF (and each mdev on one) asked again, O(1) each (its
    group's EBUSY probe; the holder sources), so a VM that opened one since the plan stops the removal."""
    if plan.recheck is None:
        return
    parents = inuse.mdev_parents(sysfs)
    vfs = pci.PciDevice(sysfs, plan.address).virtfns()
    names = vfs + [uuid for uuid, parent in sorted(parents.items()) if parent in vfs]
    now = plan.recheck(names)
    for vf in vfs:
        found = inuse.holders(now, vf, parents)
        if found:
            raise _held_error(plan, vf, found, " since the plan; nothing was written to %s" % plan.address)


def plan_vfs(sysfs, runner, devices="all", num_vfs="max", state="present", method="auto", force=False,
             held=None, sriov_manage_path=None, take_over=(), whole=None):
    """Validate everything and return a SriovPlan; nothing is written.

    `sriov_manage_path`: the sriov-manage to use (checked when NVIDIA PFs may need it); None finds it.
    `take_over`: PF addresses passed through (node/holders/pf_driver.py) the engine may rebind, none of whose
    VFIO groups may be held (`held` is asked). `whole`: claim_holders.held_whole, the GPUs DRA claims hold whole:
    skipped, or refused when named (never given VFs nor rebound; a reboot leaves them on nvidia without VFs).
    """
    if state not in STATES:
        raise SriovError("state %r is not one of %s" % (state, ", ".join(STATES)))
    if method not in METHODS:
        raise SriovError("method %r is not one of %s" % (method, ", ".join(METHODS)))
    wanted = parse_num_vfs(num_vfs) if state == "present" else 0
    skipped = []
    pfs = select_pfs(sysfs, devices, take_over, skipped, whole)
    taking = [d.address for d in pfs if d.address in take_over and pf_driver.reserved(sysfs, d) is not None]
    if taking:
        if held is None:
            raise SriovError("plan_vfs: cannot tell which devices VMs hold (no held mapping given)")
        pf_driver.check_take_over(sysfs, taking, held)
    nvidia = method != "sysfs" and any(d.vendor == pci.NVIDIA_VENDOR for d in pfs)
    tool = find_sriov_manage(runner, sriov_manage_path) if nvidia else None
    plans = []
    for dev in pfs:
        total = dev.sriov_totalvfs
        desired = total if wanted is None else wanted
        if desired > total:
            raise SriovError("%s: num_vfs %d exceeds sriov_totalvfs %d" % (dev.address, desired, total))
        chosen = _choose_method(dev, method, tool, desired, total)
        plans.append(PfPlan(dev.address, dev.vendor, dev.device, total, dev.sriov_numvfs, desired, chosen,
                            tool if chosen == "sriov_manage" else None))
    _check_removals(sysfs, plans, held, force)
    return SriovPlan(plans, skipped)


# --- apply ---------------------------------------------------------------------------------------

def _numvfs_path(address):
    return "%s/%s/sriov_numvfs" % (pci.PCI_DEVICES, address)


def _discard_profiles(sysfs, plan, record):
    """force: remove mdevs and clear vGPU types before their VFs go away (node/engine/vgpu_writer.py: each re-checked right
    before its write; `record`: the device plugin's allocation record, None when the caller names none)."""
    if not plan.discard:
        return
    writer = VgpuWriter(sysfs, plan.recheck, record)
    parents = inuse.mdev_parents(sysfs)

    def discard():
        for vf in plan.discard:
            for uuid, parent in sorted(parents.items()):
                if parent == vf:
                    writer.remove_mdev(uuid, vf)
            if vgpu_types.read_current(sysfs, vf):
                writer.clear_type(vf)
    attempt(discard, failed=lambda exc: SriovError("%s: %s; its VFs were not removed" % (plan.address, exc)))


def _write_numvfs(sysfs, plan, count):
    try:
        sysfs.write(_numvfs_path(plan.address), str(count))
    except SysfsError as err:
        if err.errno == errno.ERANGE:
            raise SriovError("%s: num_vfs %d is out of range (sriov_totalvfs %d)"
                             % (plan.address, count, plan.total_vfs)) from None
        if err.errno == errno.ENOENT:
            hint = "; use method sriov_manage for NVIDIA GPUs" if plan.nvidia else ""
            raise SriovError("%s: its driver cannot set VFs through sysfs (no sriov_configure)%s"
                             % (plan.address, hint)) from None
        raise SriovError("%s: %s" % (plan.address, err)) from None


def _run_sriov_manage(sysfs, runner, plan, flag, count, retries, retry_delay):
    """sriov-manage can exit 0 without doing anything: judge by sriov_numvfs, retry a few times.
    Returns sriov_numvfs as read after the run that set it (the wait's first look uses it)."""
    argv = [plan.tool, flag, plan.address]
    for attempt in range(1, retries + 1):
        rc, out, err = runner.run(argv, check=False)
        now = sysfs.read_int(_numvfs_path(plan.address), 0)
        if now == count:
            return now
        _fail_without_driver(sysfs, plan, " ".join(argv))
        if attempt < retries:
            time.sleep(retry_delay)
    said = (err or out or "").strip().splitlines()
    raise SriovError("%s: %s left sriov_numvfs at %d instead of %d after %d attempts (last exit %d%s)"
                     % (plan.address, " ".join(argv), now, count, retries, rc,
                        ": " + said[-1] if said else ""))


def _vf_ready(pf_dir, link):
    """The VF behind the link `link` has its nvidia/ directory (vendor VFIO) or mdev_supported_types."""
    return pf_dir.isdir(link + "/nvidia") or pf_dir.isdir(link + "/mdev_supported_types")


def not_ready(sysfs, plan, numvfs=None, first_only=False):
    """Why the PF's VFs are not ready yet, or None when they are.

    Ready: sriov_numvfs is the desired count, the PF has that many virtfn links, and (NVIDIA) every
    VF behind them has its nvidia/ directory or mdev_supported_types. The links and the VFs are
    looked up relative to the PF's directory, opened once (`Sysfs.opendir`), so the VFs are those
    the kernel linked, never addresses worked out. `numvfs`: sriov_numvfs as the caller has just
    read it (not read again). `first_only`: return at the first VF that is not ready, checking the
    last VF first (the last one the tool binds), for the quick looks of a wait; the full answer
    counts every VF that is not ready.
    """
    now = sysfs.read_int(_numvfs_path(plan.address), 0) if numvfs is None else numvfs
    if now != plan.desired:
        return "sriov_numvfs is %d, expected %d" % (now, plan.desired)
    try:
        pf_dir = sysfs.opendir("%s/%s" % (pci.PCI_DEVICES, plan.address))
    except SysfsError as err:
        if err.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise
        return "0 of %d virtfn links present (%s is gone)" % (plan.desired, plan.address)
    with pf_dir:
        links = pci.virtfn_names(pf_dir.listdir())  # one listing
        if len(links) != plan.desired:
            return "%d of %d virtfn links present" % (len(links), plan.desired)
        if not plan.nvidia or not links:
            return None
        order = [links[-1]] + links[:-1] if first_only else links
        waiting = []
        for link in order:
            if not _vf_ready(pf_dir, link):
                waiting.append(link)
                if first_only:
                    break
        if not waiting:
            return None
        first = pf_dir.link_name(waiting[0]) or waiting[0]
        if first_only:
            return "VF %s (%s) has neither nvidia/ nor mdev_supported_types yet" % (first, waiting[0])
        return "%d of %d VFs (first %s) have neither nvidia/ nor mdev_supported_types" % (
            len(waiting), len(links), first)


def _fail_without_driver(sysfs, plan, doing):
    """A PF whose `driver` link vanished (driver unloaded or unbound) gets no VFs: fail now, naming it,
    instead of retrying or waiting out the timeout."""
    if plan.desired and pci.PciDevice(sysfs, plan.address).driver is None:
        raise SriovError("%s: lost its driver (no driver link) during %s; VFs cannot appear (is the "
                         "NVIDIA vGPU host driver still loaded?)" % (plan.address, doing))


FIRST_POLL_S = 0.01     # the wait's first sleep; it doubles up to poll_interval


def _wait_ready(sysfs, plan, timeout, poll_interval, numvfs=None):
    """Wait until not_ready() says ready. Quick looks (first VF that is not ready, last VF first)
    every FIRST_POLL_S, doubling up to `poll_interval`; the message on a timeout is a full look.
    `numvfs`: sriov_numvfs as the caller has just read it, used by the first look only."""
    deadline = time.monotonic() + timeout
    delay = min(FIRST_POLL_S, poll_interval)
    while True:
        why = not_ready(sysfs, plan, numvfs=numvfs, first_only=True)
        numvfs = None
        if why is None:
            return
        _fail_without_driver(sysfs, plan, "the wait for %d VFs (%s)" % (plan.desired, why))
        now = time.monotonic()
        if now >= deadline:
            why = not_ready(sysfs, plan)      # the full look: how many VFs, the first one
            if why is None:
                return
            raise SriovError("%s: VFs not ready after %g s: %s" % (plan.address, timeout, why))
        time.sleep(min(delay, max(deadline - now, 0.0)))
        delay = min(delay * 2, poll_interval)


def _apply_pf(sysfs, runner, plan, timeout, poll_interval, retries, retry_delay, record=None):
    if plan.current:
        _recheck_removal(sysfs, plan)
    _discard_profiles(sysfs, plan, record)
    numvfs = None
    if plan.method == "sriov_manage":
        if plan.current:
            numvfs = _run_sriov_manage(sysfs, runner, plan, "-d", 0, retries, retry_delay)
        if plan.desired:
            numvfs = _run_sriov_manage(sysfs, runner, plan, "-e", plan.desired, retries, retry_delay)
    else:
        if plan.current:
            _write_numvfs(sysfs, plan, 0)
        if plan.desired:
            _write_numvfs(sysfs, plan, plan.desired)
    _wait_ready(sysfs, plan, timeout, poll_interval, numvfs)


def set_count(sysfs, runner, addresses, num_vfs, held, record=None, timeout=120.0, sriov_manage_path=None, take_over=()):
    """`num_vfs` VFs on the PFs `addresses` (0 disables them), planned and applied, verified within `timeout` s;
    sriov-manage where it can (all or no VFs), sysfs for another count. `held`: an inuse.Holders (asked before VFs go;
    forgotten after: the devices and their groups changed). The node engine's set_vfs, and a whole-GPU Prepare's."""
    method = "auto" if num_vfs in (0, "max") else "sysfs"
    plan = plan_vfs(sysfs, runner, devices=list(addresses), num_vfs=num_vfs, method=method,
                    state="present" if num_vfs else "absent", held=held, sriov_manage_path=sriov_manage_path,
                    take_over=take_over)
    try:
        return apply_vfs(sysfs, runner, plan, timeout=timeout, record=record)
    finally:
        held.forget()


def apply_vfs(sysfs, runner, plan, timeout=120.0, poll_interval=0.2, retries=3, retry_delay=2.0, record=None):
    """Execute a plan: changed PFs in parallel, each verified within `timeout` seconds. `record`: the device plugin's
    allocation record (pod_allocations.record_path), whose lock a discarded vGPU's write is made under.

    Returns the addresses of the PFs changed. When some PFs fail, the others still finish and one
    SriovError names every failed PF.
    """
    todo = [p for p in plan.pfs if p.changed]
    if not todo:
        return []
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        futures = [(p, pool.submit(_apply_pf, sysfs, runner, p, timeout, poll_interval, retries, retry_delay, record))
                   for p in todo]
    failures = []
    for dummy, future in futures:
        try:
            future.result()
        except EngineError as err:
            failures.append(str(err))
    if failures:
        raise SriovError("; ".join(failures))
    return [p.address for p in todo]
