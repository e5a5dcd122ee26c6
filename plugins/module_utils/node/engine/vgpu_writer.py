# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one writer of a vGPU on the host: a VF's `nvidia/current_vgpu_type` (set, clear) and an mdev's create and
remove. Every path goes through `VgpuWriter`: the layout engine (vgpu_vfio, vgpu_mdev), SR-IOV removal with force
(sriov), the claim-time clear and restore (claim_time_layout.finish), DRA prepare and unprepare
(kubelet/dra/claim_time_prepare). tests/unit/plugins/module_utils/test_single_writer.py fails when another file writes
the attribute.

One write, in this order (docs/design.md "Who writes a vGPU"):
1. the node lock (node_lock.py): held by the caller (apply, the DRA driver, the modules), else taken here;
2. the device plugin's allocation record lock (pod_allocations.vf_write_lock), held until the write is made, so an
   Allocate (which checks the vGPU's type under it, `pod_allocations.append(check=...)`) lands before the re-check
   or sees the new type, never between;
3. the device's holders asked again (`recheck([device])`, inuse.Holders.recheck: its VFIO group's EBUSY probe and
   every holder source, kubelet_holders.holder_sources; no /proc walk): anything but the holders the caller acts
   for (`acting_for`: the DRA claim being prepared or unprepared, the claims whose type is restored) refuses the
   write with VgpuHeld, nothing written;
4. the write, then the read-back: a type that does not read back, an mdev that does not appear or go, is a
   VgpuWriteError naming the device and the value.
The layout engine's VF writes skip the read-back (`read_back=False`): the driver's store refuses with EINVAL a type
not creatable on the VF now and sets the one it accepts (vgpu_vfio.execute), and one more sysfs round trip per
written VF would put P1 above its target (tests/bench/README.md).
"""

from __future__ import annotations

import contextlib

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import node_lock, pod_allocations
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.inuse import describe
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError

TYPE_ATTRIBUTE = "current_vgpu_type"
LOCK_WAIT = 120.0   # seconds a write waits for the node lock when its caller does not hold it


class VgpuWriteError(LayoutError):
    """A vGPU write not made, refused by the driver, or not read back. `device`, `value`; `refused`: the driver's
    SysfsError when it refused the write; `holders`: set when the device was held (VgpuHeld)."""

    def __init__(self, message, device, value, refused=None, holders=None):
        super().__init__(message)
        self.device, self.value, self.refused, self.holders = device, value, refused, holders


class VgpuHeld(VgpuWriteError):
    """Something other than the holders the caller acts for holds the device right before the write; nothing was
    written."""


def attempt(write, held=None, failed=None, acting_for=()):
    """`write()` (calls of a VgpuWriter), its refusal told in the caller's words: a VgpuHeld becomes `held(who)`
    (`who`: the holders that refused it, inuse.describe'd, those in `acting_for` left out), any other
    VgpuWriteError `failed(exc)` (also a VgpuHeld when `held` is None); without a callable for it the error
    propagates. An exception the callable returns is raised; anything else (a warning, a reason) is returned.
    None when the write was made."""
    try:
        write()
    except VgpuWriteError as exc:
        if held is not None and isinstance(exc, VgpuHeld):
            answer = held(describe([h for h in exc.holders if h not in acting_for]))
        elif failed is not None:
            answer = failed(exc)
        else:
            raise
    else:
        return None
    if isinstance(answer, Exception):
        raise answer from None
    return answer


def type_path(vf):
    return vgpu_types.vfio_dir(vf) + "/" + TYPE_ATTRIBUTE


class VgpuWriter:
    """Writes to the vGPUs of the node `sysfs` shows. `recheck(names)` -> {device: [holder]} now (inuse.Holders.recheck
    of the caller's in-use engine); None only for a caller that has no holder to ask (a test's static answer).
    `record`: the allocation record's path (pod_allocations.record_path), None when no device plugin runs there.
    `expected`: {device: [holder]} the caller acts for on every write (the layout engine: what its plan saw).
    `stopped(exc)`: the exception to raise for a write stopped before it was made (VgpuHeld, the record locked), in
    the caller's terms (the layout engine: HeldSincePlan naming what it changed); default: `exc`."""

    def __init__(self, sysfs, recheck, record=None, expected=None, stopped=None, lock_wait=LOCK_WAIT):
        self.sysfs, self.recheck, self.record = sysfs, recheck, record
        self.expected = expected if expected is not None else {}
        self.stopped = stopped if stopped is not None else (lambda exc: exc)
        self.lock_wait = lock_wait

    def set_type(self, vf, type_id, acting_for=(), read_back=True):
        """Type VF `vf` with `type_id` (0 clears it)."""
        with self._checked(vf, type_id, acting_for):
            try:
                self.sysfs.write(type_path(vf), type_id)
            except SysfsError as exc:
                raise VgpuWriteError("VF %s: the driver refused type %s: %s" % (vf, type_id, exc), vf, type_id,
                                     refused=exc) from None
        if read_back:
            try:
                back = vgpu_types.read_current(self.sysfs, vf)
            except (SysfsError, ValueError) as exc:
                back = "unreadable (%s)" % exc
            if back != int(type_id):
                raise VgpuWriteError("VF %s: wrote type %s, it reads back %s" % (vf, type_id, back), vf, type_id)

    def clear_type(self, vf, acting_for=(), read_back=True):
        self.set_type(vf, 0, acting_for, read_back)

    def remove_mdev(self, uuid, parent, acting_for=()):
        """Remove mdev `uuid` (of parent `parent`, named in an error)."""
        with self._checked(uuid, "remove", acting_for):
            self.sysfs.write("%s/%s/remove" % (vgpu_types.MDEV_DEVICES, uuid), 1)
        if self.sysfs.exists("%s/%s" % (vgpu_types.MDEV_DEVICES, uuid)):
            raise VgpuWriteError("mdev %s on %s is still present after remove" % (uuid, parent), uuid, "remove")

    def create_mdev(self, parent, dirname, uuid):
        """Create mdev `uuid` of type directory `dirname` on `parent`: a new device, which nothing can hold yet."""
        with self._node_lock(uuid, dirname):
            self.sysfs.write("%s/%s/mdev_supported_types/%s/create" % (vgpu_types.MDEV_BUS, parent, dirname), uuid)
        if not self.sysfs.exists("%s/%s" % (vgpu_types.MDEV_DEVICES, uuid)):
            raise VgpuWriteError("mdev %s on %s did not appear after create" % (uuid, parent), uuid, dirname)

    @contextlib.contextmanager
    def _node_lock(self, device, value):
        """The caller's node lock, else this write's own (at most `lock_wait` s: a VgpuWriteError after that)."""
        if node_lock.held_here(self.sysfs.root):
            yield
            return
        try:
            lock = node_lock.node_lock(self.sysfs.root, self.lock_wait).acquire()
        except node_lock.NodeLockError as exc:
            raise self.stopped(VgpuWriteError("%s not written: %s" % (device, exc), device, value)) from None
        try:
            yield
        finally:
            lock.release()

    @contextlib.contextmanager
    def _checked(self, device, value, acting_for):
        """Steps 1-3 of the module doc around one write."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._node_lock(device, value))
            if self.record is not None:
                try:
                    stack.enter_context(pod_allocations.vf_write_lock(self.record))
                except OSError as exc:
                    raise self.stopped(VgpuWriteError(
                        "%s not written: the device plugin's allocation record stays locked (%s)" % (device, exc),
                        device, value)) from None
            if self.recheck is not None:
                mine = set(self.expected.get(device) or ()) | set(acting_for or ())
                found = list(self.recheck([device]).get(device) or ())
                if not set(found) <= mine:
                    raise self.stopped(VgpuHeld("%s is held by %s; nothing written" % (device, describe(found)),
                                                device, value, holders=found))
            yield
