# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Program a vGPU layout on a node: read -> plan -> validate -> execute -> verify.

Shared by the module `vgpu_profile` and the node CLI `accelops-vgpu`. Everything is planned and
validated for every selected GPU before the first write (bad input never writes); writes run per
GPU: clears/removals, then mixed-size mode when the GPU gets several framebuffer sizes and `-ghm`
says it is off (`nvidia-smi vgpu -i <PF> -shm 1`; sriov-manage resets it, brief 1.4; the driver
switches only an empty GPU, so the plan then clears and re-creates its existing vGPUs), then
creations. Whether each such GPU supports the mode at all (`nvidia-smi -q`: Heterogeneous Time-Slice
Sizes; Turing does not) is asked while planning, so a T4 fails before the L40S before it is
written. The node is re-read afterwards and must match the plan.

Framework per GPU: the PF is an mdev parent -> mdev (Turing); its VFs have `nvidia/current_vgpu_type`
-> vendor-VFIO (Ada/Hopper/Blackwell); its VFs are mdev parents -> mdev (Ampere SR-IOV). A GPU with
SR-IOV but no VFs fails (the module) or gets its VFs enabled through the sriov engine first
(`enable_vfs=True`: the node CLI's `apply`, which runs at boot and after vGPU-manager restarts, and the agent).
A claim-time GPU without VFs (node/engine/claim_time_layout.py: after a reboot) gets them the same way, and no type.

Type names of consumed IDs: `current_vgpu_type` shows only an ID and creatable lists drop consumed
types, so IDs seen in creatable lists are remembered in a small per-node cache in the lock directory
(tmpfs /run: VFs and their types do not survive a reboot either) and, when still unknown, asked from
`nvidia-smi vgpu -s -v -i <PF>`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict, namedtuple

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, inuse, kubelet_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import claim_time_layout, claim_time_mig
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import layout_fit
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import mig, sriov
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pf_driver, pod_allocations
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_mdev, vgpu_vfio, vgpu_writer
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types as vt
from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import RENAME, write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.gpu_models import model_name
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import lock_dir, lock_name, node_lock
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import (
    GpuPlan, LayoutError, drop_reserved, naming_entry, nvidia_gpus, resolve, type_size_gb)

NVIDIA_SMI = "nvidia-smi"
DRIVER_VERSION = "module/nvidia/version"
STATES = ("present", "absent")
BACKENDS = {vgpu_vfio.FRAMEWORK: vgpu_vfio, vgpu_mdev.FRAMEWORK: vgpu_mdev}
NEEDS_VFS = "needs-vfs"
WAIT_TIMEOUT = 120.0  # seconds for enabled VFs to become ready (the node CLI's --wait-timeout)


def framework_of(sysfs, gpu, vfs=None):
    """`vendor-vfio`, `mdev`, or NEEDS_VFS (SR-IOV GPU without VFs); else a LayoutError.

    `vfs`: the GPU's VF addresses when already read (nvidia_gpus gives them).
    """
    parents = set(vt.mdev_parents(sysfs))
    if gpu.address in parents:
        return vgpu_mdev.FRAMEWORK
    dev = pci.PciDevice(sysfs, gpu.address)
    vfs = dev.virtfns() if vfs is None else vfs
    if any(vt.has_vfio_types(sysfs, vf) for vf in vfs):
        return vgpu_vfio.FRAMEWORK
    if any(vf in parents for vf in vfs):
        return vgpu_mdev.FRAMEWORK
    if dev.sriov_capable and not vfs:
        return NEEDS_VFS
    raise NoVgpuInterface("GPU %s %s; is the NVIDIA vGPU host driver loaded?" % (gpu.address, NO_VGPU))


NO_VGPU = "offers no vGPU interface (not an mdev parent, no VF with nvidia/current_vgpu_type)"


class NoVgpuInterface(LayoutError):
    """A GPU without any vGPU interface (e.g. passed whole into this machine, which is itself a VM)."""


def frameworks_of(sysfs, selection, gpus, vfs_of):
    """({address: framework}, [pf_driver.Skipped]) of the GPUs `selection` has. A GPU that offers no vGPU
    interface is taken out of `selection` and skipped (a one-line note naming it) when `devices: all` or a filter
    chose it, so the node's other GPUs are programmed; an entry naming it is a LayoutError naming it. When no GPU
    selected offers one, the first such error stands: a node whose vGPU manager is not loaded fails, not passes."""
    found, skipped, first = OrderedDict(), [], None
    for address in list(selection):
        try:
            found[address] = framework_of(sysfs, gpus[address], vfs_of.get(address))
        except NoVgpuInterface as exc:
            entry, named = naming_entry(selection[address], gpus[address])
            if entry is not None:
                raise NoVgpuInterface("%s: devices: %s %s" % (entry.origin, named, NO_VGPU)) from None
            first = first or exc
            skipped.append(pf_driver.Skipped(address, pci.PciDevice(sysfs, address).driver, NO_VGPU))
            del selection[address]
    if first is not None and not found:
        raise first
    return found, skipped


class TypeNames:
    """Names for type IDs the creatable lists no longer show: the node cache, then nvidia-smi.

    Called as `names(pf) -> (types, complete)`; `complete` says the list is every type the GPU
    supports (a cache filled while the GPU had no vGPUs, or the driver's supported list), which
    makes the framebuffer check possible.
    """

    def __init__(self, sysfs, runner, cache_dir=None, smi=None):
        self.sysfs, self.runner = sysfs, runner
        self.smi = smi or mig.Smi(runner)   # its FixedAnswers: `vgpu -s -v` asked once, also for mig.prepare
        self.path = os.path.join(cache_dir or lock_dir(), lock_name(sysfs.root)[:-len(".lock")] + "-vgpu-types.json")
        try:
            with open(self.path) as handle:
                self.cache = json.load(handle)
        except (OSError, ValueError):
            self.cache = {}
        # type IDs are the driver's: a cache from another driver version (reloaded without a
        # reboot, /run survives that) names nothing
        driver = sysfs.read_optional(DRIVER_VERSION)
        if not isinstance(self.cache, dict) or not isinstance(self.cache.get("types"), dict) or \
                self.cache.get("driver") != driver:
            self.cache = {"types": {}, "complete": [], "driver": driver}

    def __call__(self, pf):
        known = [vt.VgpuType(int(i), n) for i, n in self.cache["types"].get(pf, {}).items() if str(i).isdigit()]
        if pf in self.cache["complete"]:
            return known, True
        from_smi = self._from_smi(pf)
        return known + from_smi, bool(from_smi)

    def _from_smi(self, pf):
        if not self.runner:
            return []
        try:
            return vt.parse_smi_supported(self.smi.supported_text(pf))
        except LayoutError:    # no nvidia-smi, or it failed: names from the cache only
            return []

    def supported(self, pf):
        """Every type the GPU supports as the node cache knows it (no driver call), or None."""
        if pf not in self.cache["complete"]:
            return None
        return [vt.VgpuType(int(i), n) for i, n in self.cache["types"].get(pf, {}).items() if str(i).isdigit()]

    def remember(self, pf, types, complete=False):
        entry = self.cache["types"].setdefault(pf, {})
        for vgpu_type in types:
            entry[str(vgpu_type.type_id)] = vgpu_type.name
        if complete and pf not in self.cache["complete"]:
            self.cache["complete"].append(pf)

    def save(self):
        try:
            write_file(self.path, json.dumps(self.cache, sort_keys=True), sync=RENAME)
        except OSError:
            pass  # a lost cache only means asking nvidia-smi next time


def heterogeneous_mode(runner, pf):
    """True/False from `nvidia-smi vgpu -i <PF> -ghm` (tolerant of layout and wording)."""
    rc, out, err = runner.run([_smi(runner), "vgpu", "-i", pf, "-ghm"], check=False)
    if rc != 0:
        raise LayoutError("GPU %s: nvidia-smi vgpu -ghm failed: %s" % (pf, " ".join((err or out).split())[:200]))
    lines = [line for line in out.splitlines() if "heterogeneous" in line.lower() and ":" in line] or out.splitlines()
    for line in lines:
        value = line.rpartition(":")[2].strip().lower()
        if value in ("enabled", "enable", "on", "1", "true", "yes"):
            return True
        if value in ("disabled", "disable", "off", "0", "false", "no"):
            return False
    raise LayoutError("GPU %s: cannot read the heterogeneous (mixed-size) mode from nvidia-smi: %r" % (pf, out[:120]))


def mixed_mode_supported(runner, pf):
    """`Heterogeneous Time-Slice Sizes` of `nvidia-smi -q -i <PF>` (read-only, asked while planning)."""
    rc, out, err = runner.run([_smi(runner), "-q", "-i", pf], check=False)
    if rc != 0:
        raise LayoutError("GPU %s: nvidia-smi -q failed: %s" % (pf, " ".join((err or out).split())[:200]))
    mode = None
    for line in out.splitlines():
        name, dummy, value = line.partition(":")
        if "heterogeneous time-slice sizes" in name.lower():
            return value.strip().lower() == "supported"
        if name.strip().lower() == "virtualization mode":
            mode = value.strip()
    if mode and mode.lower() != "host vgpu":
        # a real driver without the vGPU manager says "Pass-Through" (tests/gpusim/captures/nvidia-smi-q-h100-580.txt)
        raise LayoutError("GPU %s: nvidia-smi -q says Virtualization Mode %s, not Host VGPU: the vGPU manager "
                          "driver is not loaded for it (accelops.vgpu.vgpu_driver)" % (pf, mode))
    raise LayoutError("GPU %s: nvidia-smi -q does not say whether the GPU supports mixed-size mode "
                      "(no 'Heterogeneous Time-Slice Sizes' line)" % pf)


def _smi(runner):
    tool = runner.which(NVIDIA_SMI)
    if not tool:
        raise LayoutError("mixed_size needs nvidia-smi, which is not on PATH")
    return tool


def _needs_mixed_mode(plan):
    """More than one framebuffer size after the apply (check_sizes already required mixed_size)."""
    sizes = set(type_size_gb(t) for t in plan.after_types())
    return len(sizes - {None}) > 1


PlanEntry = namedtuple("PlanEntry", "gpu framework view plan")
PlanEntry.__doc__ = """One GPU of a plan (NodeEngine.plan): the GPU (pci.PciDevice), its framework (a BACKENDS key or NEEDS_VFS),
the backend's view of it before any write (None until its VFs are enabled) and its GpuPlan."""


class NodeEngine:
    """The node engine: one node seen through its roots (sysfs, /dev, /proc, the kubelet directory); it plans a
    layout and writes it (`apply()` runs the whole flow)."""

    def __init__(self, sysfs, runner, dev_root="/dev", proc_root="/proc", cache_dir=None, sriov_manage_path=None,
                 mig_options=None, kubelet_dir=claim_holders.DEFAULT_KUBELET_DIR, take_over=(),
                 claim_time_declaration=None, before_writes=None, smi_answers=None):
        self.sysfs, self.runner = sysfs, runner
        # GPUs passed through (not on nvidia) are skipped, never rebound, unless listed here (node/holders/pf_driver.py)
        self.take_over, self.skipped = tuple(take_over or ()), []
        # vGPUs of DRA claims prepared on this node and of device plugin allocations to live pods are held like a
        # VM's (node/holders/kubelet_holders.py)
        self.kubelet_dir = kubelet_dir
        self.holder_sources = kubelet_holders.holder_sources(kubelet_dir)
        # MIG-backed vGPU (node/engine/mig.py); `smi_answers`: a mig.FixedAnswers kept across engines (the agent's)
        self.boot_id = claim_holders.read_boot_id(proc_root)   # claim-time types are restored for this boot's claims
        self.smi = mig.cached_smi(runner, smi_answers, sysfs, self.boot_id)
        self.mig_options = mig_options or mig.MigOptions()
        self.dev_root, self.proc_root = dev_root, proc_root
        self.sriov_manage_path = sriov_manage_path  # for enable_vfs; None = find sriov-manage
        self.names = TypeNames(sysfs, runner, cache_dir, self.smi)
        self.planned_held = {}  # what plan() saw held: a device held since then stops its GPU
        self.holders = None     # inuse.Holders of the apply under way (held() makes one)
        # GPUs whose profile DRA claims choose (node/engine/claim_time_layout.py): the agent's declaration; plan()
        # leaves those GPUs out and records the modes in `modes`. None: a caller without one keeps the recorded modes
        self.claim_time_declaration = claim_time_declaration
        self.modes_file = claim_time_layout.modes_path(kubelet_dir)
        self.modes = claim_time_layout.Modes()
        # before_writes(names): told which VFs and mdevs the writes will touch, before the first (the agent's device
        # plugin stops serving them: VgpuDevicePlugin.withdraw)
        self.before_writes = before_writes
        # plan() got as far as the claim-time GPUs' offers (modes.offers): true also when the layout's plan or writes
        # fail after them (the agent still serves those GPUs: agent_plugin.reconciled `planned`)
        self.offers_planned = False

    @property
    def in_use(self):
        """The in-use answers of this apply (inuse.Holders): the devices' groups read once, /proc walked once;
        `begin()` starts a new one."""
        if self.holders is None:
            self.begin()
        return self.holders

    def begin(self):
        """A new apply: what the last one read about the devices and the processes is read again."""
        self.holders = inuse.Holders(self.sysfs, self.dev_root, self.proc_root, self.holder_sources)
        return self.holders

    def held(self, scope=None, reuse=False):
        """inuse.held_devices for this node; `scope`: the devices about to be written (probed when the
        /proc scan is incomplete), None = all; `reuse`: the last walk of /proc of this apply stands."""
        return self.in_use.held(scope, reuse)

    def stop_if_newly_held(self, plans, done=(), probe=True):
        """Raise HeldSincePlan before the first write to a GPU whose change touches a device held since the
        plan (a VM that started while the agent waited for operands, a claim prepared meanwhile). No new walk
        of /proc: the holder sources are read again and, with `probe` (after a wait; a mode or MIG change that
        touches every VF at once), each touched device's group is asked of the kernel. The write to each VF
        or mdev is checked again right before it (writer())."""
        changing = [(e.gpu, e.plan) for e in plans if e.plan.steps]
        if not changing:
            return
        touched = dict((plan.address, _touched(self.sysfs, gpu.address, plan, self.in_use.parents()))
                       for gpu, plan in changing)
        wide = [plan.address for gpu, plan in changing if probe or plan.switch_mode or
                (plan.mig is not None and plan.mig.changed)]
        every = set().union(*touched.values())
        now = self.in_use.recheck(sorted(set().union(*(touched[a] for a in wide))) if wide else [], watched=every)
        self._stop_on(now, changing, touched, done)

    def _stop_on(self, now, changing, touched, done):
        # a holder the plan did not see (a VF a claim held at plan time is written only to restore its type:
        # a VM that opened it since must stop that write too)
        newly = dict((name, found) for name, found in now.items()
                     if not set(found) <= set(self.planned_held.get(name) or ()))
        for gpu, plan in changing:
            for name in sorted(touched.get(plan.address, ())):
                if name in newly:
                    raise HeldSincePlan(gpu.address, name, newly[name], list(done),
                                        [p.address for g, p in changing if p.address not in done])

    def writer(self, gpu, plans, done):
        """The vGPU writer (node/engine/vgpu_writer.py) of the writes to the VFs and mdevs of `gpu`: right before each, under
        the allocation record's lock, the device's own group is asked of the kernel and the holder sources read:
        HeldSincePlan when a VM opened it or a pod was allocated it since the plan (a holder the plan saw, a claim
        whose type is restored, is what the engine acts for)."""
        changing = [e.plan.address for e in plans if e.plan.steps]
        before = self.sysfs.writes

        def stopped(exc):
            # the GPU counts as changed once one of its writes was made
            made = [a for a in done if a != gpu.address or self.sysfs.writes != before]
            if isinstance(exc, vgpu_writer.VgpuHeld):
                return HeldSincePlan(gpu.address, exc.device, exc.holders, made, [a for a in changing if a not in made])
            return LayoutError("GPU %s: %s; changed: %s" % (gpu.address, exc, ", ".join(made) or "none"))
        return vgpu_writer.VgpuWriter(self.sysfs, self.in_use.recheck, pod_allocations.record_path(self.kubelet_dir),
                                      self.planned_held, stopped=stopped)

    def announce_writes(self, plans):
        """`before_writes(names)` (the agent's device plugin: served Unhealthy from now on) with every VF and mdev the
        plans' writes touch, before the first of them."""
        names = set()
        for entry in plans:
            if entry.plan.steps:
                names |= _touched(self.sysfs, entry.gpu.address, entry.plan, self.in_use.parents())
        if names and self.before_writes is not None:
            self.before_writes(sorted(names))

    def claimed_types(self, held):
        """{device: type ID} of the prepared DRA claims, read only when a claim holds something."""
        if not any(claim_holders.is_claim_holder(h) for found in held.values() for h in found):
            return {}
        return claim_holders.claimed_types_of(self.kubelet_dir)

    def view(self, gpu, framework, held, vfs=None):
        if framework == vgpu_vfio.FRAMEWORK:
            view = vgpu_vfio.VfioGpu(self.sysfs, gpu, held, self.names, vfs, self.names.supported(gpu.address))
            self.names.remember(gpu.address, list(view.catalog.values()), view.lists_complete)
            return view
        return vgpu_mdev.MdevGpu(self.sysfs, gpu, held)

    def enable_vfs(self, addresses, wait_timeout=WAIT_TIMEOUT):
        """Enable the maximum VF count on GPUs that have none (sriov engine, method auto); the VFs must
        be ready within `wait_timeout` s (a PF that loses its driver fails at once)."""
        return self.set_vfs(addresses, "max", wait_timeout)

    def plan(self, entries, state="present", mixed_size=False, enable_vfs=False, check_mode=False, reuse=False):
        """[(gpu, framework, view, GpuPlan)] for every GPU the layout selects; raises before writes.
        `reuse`: the processes this apply's walk of /proc saw stand (a plan again after VFs were enabled).

        A GPU without VFs is planned as pending when they will be enabled first: by apply itself
        (`enable_vfs`) or, in check mode, by the sriov_vfs task before it (which only plans then).
        """
        if state not in STATES:
            raise LayoutError("state %r is not one of %s" % (state, ", ".join(STATES)))
        vfs_of = {}  # PF -> VF addresses, read once per plan (a readlink each)
        gpus = dict((g.address, g) for g in nvidia_gpus(self.sysfs, vfs_of))
        selection = resolve(entries, list(gpus.values()), self.sysfs)
        walked = []
        self.offers_planned = False

        def held_for_modes(scope):
            walked.append(True)
            return self.held(scope, reuse=reuse)
        self.modes = claim_time_layout.plan(self.sysfs, self.claim_time_declaration, list(gpus.values()), self.modes_file,
                                            held_for_modes, vfs_of, recheck=self.in_use.recheck,
                                            boot_id=self.boot_id)
        selection = OrderedDict((a, e) for a, e in selection.items() if a not in self.modes.gpus)
        for address, allow in self.modes.offerable():     # a claim-time GPU passed through offers nothing
            self._claim_time_offers(gpus[address], allow, vfs_of.get(address), enable_vfs and state == "present")
        self.offers_planned = True
        # a GPU a DRA claim holds whole is never the layout's, even where the modes file lost it (held, not reserved)
        self.skipped = self.modes.reserved + drop_reserved(selection, list(gpus.values()), self.sysfs, self.take_over,
                                                           claim_time_layout.held_whole_at(self.modes_file))
        frameworks, no_vgpu = frameworks_of(self.sysfs, selection, gpus, vfs_of)
        self.skipped += no_vgpu
        # the scope names the VFs too (read with the GPUs): no physfn link is read to place them
        scope = list(selection) + [vf for address in selection for vf in vfs_of.get(address) or ()]
        held = self.planned_held = self.held(scope, reuse=reuse or bool(walked))
        pf_driver.check_take_over(self.sysfs, self._taking_over(selection), held)
        claimed = self.claimed_types(held)
        plans = []
        for address, gpu_entries in selection.items():
            gpu, framework = gpus[address], frameworks[address]
            if framework == NEEDS_VFS:
                if not (enable_vfs or check_mode):
                    raise LayoutError("GPU %s: SR-IOV VFs are not enabled; enable them first (accelops.vgpu.sriov_vfs, "
                                      "or accelops-vgpu apply which enables them)" % address)
                plans.append(PlanEntry(gpu, framework, None,
                                       self._pending_plan(gpu, gpu_entries, state, enable_vfs, mixed_size)))
                continue
            view = self.view(gpu, framework, held, vfs_of.get(address))
            if framework == vgpu_vfio.FRAMEWORK:
                view.restorable = vgpu_vfio.restorable(view, claimed)
            mig_state = (mig.prepare(self.sysfs, self.smi, view, gpu_entries, self.mig_options, self.names)
                         if framework == vgpu_vfio.FRAMEWORK else None)
            plan = BACKENDS[framework].plan(view, gpu_entries, mixed_size, state == "absent")
            if mig_state is not None:
                mig.plan(mig_state, plan, view, self.smi)
            if plan.model is None:
                plan.model = model_name(gpu.vendor, gpu.device)
            if leaves_mig(plan):  # VFs enabled again reset the mode: only whether the GPU has it counts now
                if _needs_mixed_mode(plan):
                    self._check_mixed_supported(plan)
            elif plan.mig is None and _needs_mixed_mode(plan) and not heterogeneous_mode(self.runner, gpu.address):
                self._check_mixed_supported(plan)
                plan.switch_mode = True
                BACKENDS[framework].rebuild(view, plan)
            plans.append(PlanEntry(gpu, framework, view, plan))
        return plans

    def _claim_time_offers(self, gpu, allow, vfs, enable_vfs=False):
        """What a claim-time GPU offers (claim_time_layout.offers) into self.modes; a GPU without VFs offers
        nothing yet: with `enable_vfs` apply enables them first (modes.needs_vfs: VFs do not survive a reboot, and
        the layout never selects this GPU), else a warning. One that is no vendor-VFIO GPU is an error naming it."""
        framework = framework_of(self.sysfs, gpu, vfs)
        if framework == NEEDS_VFS:
            if enable_vfs:
                self.modes.needs_vfs.append(gpu.address)
            else:
                self.modes.warnings.append("GPU %s: claim-time mode: SR-IOV VFs are not enabled; it offers no vGPU "
                                           "until they are (accelops.vgpu.sriov_vfs)" % gpu.address)
            self.modes.offers[gpu.address] = {"model": model_name(gpu.vendor, gpu.device), "vfs": 0, "profiles": []}
            return
        if framework != vgpu_vfio.FRAMEWORK:
            raise LayoutError("GPU %s: claim-time mode needs a vendor-VFIO GPU (vGPU 17+ on Ada, Hopper or Blackwell); "
                              "this one is an mdev GPU" % gpu.address)
        view = self.view(gpu, framework, {}, vfs)
        if claim_time_mig.wanted(allow):     # MIG-backed: placed at Prepare (node/engine/claim_time_mig.py)
            self.modes.offers[gpu.address] = self._claim_time_mig_offers(view, allow)
            return
        self.modes.offers[gpu.address] = {
            "model": view.model or model_name(gpu.vendor, gpu.device), "vfs": len(view.vfs),
            "profiles": claim_time_layout.offers(view, allow, claim_time_layout.max_instances(self.runner, gpu.address))}

    def _claim_time_mig_offers(self, view, allow):
        """A MIG claim-time GPU's offers: its free placements per allowed type, GIs our claims did not make left
        alone (claim_time_mig.offers); not in MIG mode: nothing, and a warning."""
        records = claim_time_mig.recorded(claim_holders.read_claims(
            claim_holders.checkpoint_path(os.path.dirname(self.modes_file))), self.boot_id).get(view.gpu.address, [])
        facts, profiles, warning = claim_time_mig.offers(self.smi, view, allow, records)
        if warning:
            self.modes.warnings.append(warning)
        offer = {"model": view.model or model_name(view.gpu.vendor, view.gpu.device), "vfs": len(view.vfs),
                 "profiles": profiles}
        if facts is not None:
            offer["mig"] = facts
        return offer

    def _taking_over(self, selection):
        """The take_over PFs this plan selects that are not on the vGPU host driver yet (to be rebound)."""
        return [a for a in self.take_over if a in selection
                and pf_driver.reserved(self.sysfs, pci.PciDevice(self.sysfs, a)) is not None]

    def _check_mixed_supported(self, plan):
        if not mixed_mode_supported(self.runner, plan.address):
            raise LayoutError("GPU %s (%s) does not support mixed-size mode (nvidia-smi -q: Heterogeneous "
                              "Time-Slice Sizes: Not Supported); give it one framebuffer size" % (plan.address, plan.model))

    def _pending_plan(self, gpu, entries, state, by_apply=True, mixed_size=False):
        """A GPU whose VFs are enabled first (by apply, or by sriov_vfs before a check-mode run): the
        layout is validated now (layout_fit: nothing may be written for a layout that cannot fit);
        its vGPUs are planned once the VFs exist, so every requested vGPU counts as to be created."""
        plan = GpuPlan(gpu.address, None, model_name(gpu.vendor, gpu.device), "%s:%s" % (gpu.vendor, gpu.device),
                       entries[-1].origin)
        if state == "absent":
            return plan
        if mig.wants_mig(entries):
            mig.check_kinds(gpu.address, entries)
        entry, plan.pending, offer = layout_fit.check_gpu_without_vfs(
            self.sysfs, gpu, entries, mixed_size, self.names, lambda pf: mixed_mode_supported(self.runner, pf))
        mig.check_pending(self.smi, gpu.address, plan.pending)
        plan.origin = entry.origin
        plan.steps.append(("enable-vfs", gpu.address))
        creates = ", ".join("%d x %s" % (n, p) for p, n in plan.pending.items()) or "nothing"
        if by_apply:
            plan.warnings.append("GPU %s: VFs are disabled; apply enables them, then creates %s" % (gpu.address, creates))
        else:
            plan.warnings.append("GPU %s: SR-IOV VFs are not enabled yet; once accelops.vgpu.sriov_vfs has enabled "
                                 "them, %s will be created (check mode: validated against %s, not yet against the "
                                 "driver's creatable lists)" % (gpu.address, creates, offer.source))
        return plan

    def leave_mig(self, plans, wait_timeout=WAIT_TIMEOUT):
        """The way out of MIG mode of the plans that take it (mig.py `leave`), each step verified: clear
        the vGPUs, destroy the GPU instances, disable the VFs, MIG mode off, enable as many VFs again.
        Returns the addresses of the GPUs whose VFs it enabled; their types are set by a new plan."""
        done = []
        self.announce_writes([e for e in plans if leaves_mig(e.plan)])
        for entry in plans:
            gpu, framework, view, plan = entry
            if not leaves_mig(plan):
                continue
            self.stop_if_newly_held([entry], done)
            BACKENDS[framework].execute(self.sysfs, view, plan, [s for s in plan.steps if s[0] == "clear"],
                                        self.writer(gpu, plans, done))
            mig.execute(self.smi, plan.mig)
            count, total = len(view.vfs), pci.PciDevice(self.sysfs, plan.address).sriov_totalvfs
            self.set_vfs([plan.address], 0, wait_timeout)
            mig.mode_off(self.smi, plan.address)
            self.set_vfs([plan.address], "max" if count == total else count, wait_timeout)
            done.append(plan.address)
        return done

    def set_vfs(self, addresses, num_vfs, wait_timeout=WAIT_TIMEOUT):
        """sriov engine: `num_vfs` VFs on the PFs (0 disables them), verified ready within `wait_timeout` s;
        sriov-manage where it can (all or no VFs), sysfs for another count."""
        return sriov.set_count(self.sysfs, self.runner, addresses, num_vfs, self.in_use,
                               pod_allocations.record_path(self.kubelet_dir), wait_timeout,
                               self.sriov_manage_path, self.take_over)

    def execute(self, plans):
        """Writes, GPU by GPU: clears/removals, mixed-size mode when the plan needs it, creations.
        Before each GPU's first write the holder sources are read again (and, for a mode or MIG change, every
        touched device's group probed: stop_if_newly_held); right before each VF's or mdev's write its own
        group is asked of the kernel (writer)."""
        done = []
        self.announce_writes(plans)
        for entry in plans:
            gpu, framework, view, plan = entry
            if not plan.steps:
                continue
            self.stop_if_newly_held([entry], done, probe=False)
            writer = self.writer(gpu, plans, done)
            done.append(plan.address)
            backend = BACKENDS[framework]
            backend.execute(self.sysfs, view, plan, [s for s in plan.steps if s[0] in ("clear", "remove")], writer)
            if plan.mig is not None and not plan.mig.leave:
                mig.execute(self.smi, plan.mig)
            if plan.switch_mode:
                self.runner.run([_smi(self.runner), "vgpu", "-i", plan.address, "-shm", "1"])
            backend.execute(self.sysfs, view, plan, [s for s in plan.steps if s[0] in ("set", "create")], writer)

    def verify(self, plans):
        """Every changed GPU's vGPUs must now be what the plan said.

        Vendor-VFIO: execute put every write the driver accepted into the view, and the VFs it did
        not write were read (or, on a GPU without vGPUs, known free) at plan time under the node
        lock, so the view is the node; mdev GPUs are read again.
        """
        for gpu, framework, view, plan in plans:
            if not plan.steps:
                continue
            if framework != vgpu_vfio.FRAMEWORK:   # the mdevs are read again; who holds them is the plan's answer
                view = self.view(gpu, framework, self.planned_held)
            wanted = _counts(v.after for v in plan.vgpus)
            have = BACKENDS[framework].current_profiles(view)
            if wanted != have:
                raise LayoutError("GPU %s: after applying it has %s, expected %s" % (gpu.address, _text(have), _text(wanted)))

    def mig_before_vfs(self, plans):
        """MIG mode on GPUs whose VFs are about to be enabled, when the order says so (cubecos's)."""
        if self.mig_options.mode_order != "before-vfs":
            return
        for gpu, framework, view, plan in plans:
            if framework == NEEDS_VFS and plan.pending and mig.pending_state(plan.pending):
                if self.smi.mode(gpu.address) is None:
                    raise LayoutError("GPU %s: the layout has MIG-backed profiles, but the GPU has no MIG mode"
                                      % gpu.address)
                if not self.smi.mode(gpu.address):
                    self.smi.run(gpu.address, ["-i", gpu.address, "-mig", "1"], "-mig 1")

    def current(self, gpu):
        """{profile: count} now on a GPU, or None when it has no VFs yet."""
        framework = framework_of(self.sysfs, gpu)
        if framework == NEEDS_VFS:
            return None
        return BACKENDS[framework].current_profiles(self.view(gpu, framework, {}))


class HeldSincePlan(LayoutError):
    """A device a GPU's change touches became held after the plan; that device was not written.
    `done`: GPUs changed (the GPU itself when the writer stopped it part-way); `not_done`: the GPUs after it."""

    def __init__(self, gpu, device, found, done, not_done):
        self.gpu, self.device, self.done, self.not_done = gpu, device, done, not_done
        self.result = {"changed": bool(done), "gpus_changed": list(done), "gpus_not_changed": list(not_done)}
        kind = "mdev" if "-" in device else "VF"
        # before the GPU's first write, or (the writer right before one write) part-way through the GPU
        spared = ("it was not written, nor anything after it on GPU %s" % gpu if gpu in done
                  else "nothing was written to GPU %s" % gpu)
        super().__init__("GPU %s: %s %s became held by a VM (%s) after the plan; %s (changed: %s; not changed: %s)"
                         % (gpu, kind, device, inuse.describe(found), spared, ", ".join(done) or "none",
                            ", ".join(not_done) or "none"), held=[device])


def _touched(sysfs, address, plan, parents):
    """Devices a GPU's change writes to (VFs typed or cleared, mdevs removed); with a MIG or
    mixed-size mode change every VF and mdev of the GPU."""
    names = set(step[1] for step in plan.steps if step[0] in ("clear", "set", "remove"))
    if plan.switch_mode or (plan.mig is not None and plan.mig.changed):
        vfs = set(pci.PciDevice(sysfs, address).virtfns()) | {address}
        names |= vfs | set(uuid for uuid, parent in parents.items() if parent in vfs)
    return names


def _counts(types):
    counts = {}
    for vgpu_type in types:
        if vgpu_type is not None:
            counts[vgpu_type.short] = counts.get(vgpu_type.short, 0) + 1
    return counts


def _text(counts):
    return ", ".join("%d x %s" % (n, p) for p, n in sorted(counts.items())) or "no vGPUs"


def apply(node, entries, state="present", mixed_size=False, check_mode=False, lock_timeout=120.0,
          enable_vfs=False, wait_timeout=WAIT_TIMEOUT, before_changes=None, stop=None):
    """The whole flow; returns the result dict (changed, gpus, resources, diff, warnings).

    `lock_timeout`: seconds to wait for the node lock; `wait_timeout`: for VFs it enables to be ready.
    `before_changes()`: called once the plan is validated and changes something, before the first
    write (the node agent sets its `pending` state there); an exception from it writes nothing.
    /proc is walked once (the plan); after the hook every device the apply touches is asked of the kernel
    again, before each GPU's first write the holder sources, right before each write its own group
    (HeldSincePlan; docs/design.md "In use").
    `stop`: a threading.Event that ends the wait for the node lock (the agent's SIGTERM).
    """
    lock = contextlib.nullcontext() if check_mode else node_lock(node.sysfs.root, lock_timeout, stop=stop)
    with lock, node.sysfs.walk_cache():
        node.begin()
        plans = node.plan(entries, state, mixed_size, enable_vfs, check_mode)
        claim_vfs = list(node.modes.needs_vfs)   # claim-time GPUs whose VFs are enabled before the writes
        if before_changes is not None and not check_mode and (
                claim_vfs or any(e.plan.changed for e in plans)):
            before_changes()
            node.stop_if_newly_held(plans)   # the hook may have waited: a VM may have opened a VF meanwhile
        first = list(plans)
        enabled = [] if check_mode else _prepare_vfs(node, plans, entries, state, mixed_size, wait_timeout)
        _carry_mig_exit(first, plans)
        if not check_mode:
            node.names.save()
            node.execute(plans)
            node.verify(plans)
            claim_time_layout.finish(node.sysfs, node.modes, node.modes_file,
                                     pod_allocations.record_path(node.kubelet_dir))
    result = summarize([e.plan for e in plans])
    if node.modes.gpus:
        result["claim_time"] = node.modes.result()
        result["warnings"].extend(node.modes.warnings)
    result["changed"] = result["changed"] or node.modes.changed or bool(claim_vfs)
    for address in claim_vfs:    # as a layout GPU's pending VFs show (diff()), in check mode and not
        result["diff"]["before"][address] = OrderedDict([("vfs", "disabled")])
        result["diff"]["after"][address] = OrderedDict([("vfs", "enabled"), ("claim_time", True)])
    result["vfs_enabled"] = enabled
    add_skipped(result, node.skipped)
    if not plans:
        result["warnings"].append("the layout selects no NVIDIA GPU on this node; nothing to do")
    return result


def add_skipped(result, skipped):
    """The GPUs passed through that the layout left alone: `reserved` ({address, driver, reason}) and a warning each."""
    result["reserved"] = [s.to_dict() for s in skipped]
    result["warnings"].extend("GPU %s" % s.line() for s in skipped)


def leaves_mig(plan):
    """Whether the plan takes its GPU out of MIG mode (mig.py `leave`)."""
    return plan.mig is not None and plan.mig.leave


def _prepare_vfs(node, plans, entries, state, mixed_size, wait_timeout):
    """Before the vGPU writes: the ways out of MIG mode, then VFs on GPUs without (in MIG mode first when
    the order says so). A GPU left in MIG mode without VFs (an earlier run stopped half-way) comes out of
    it on the next round. Returns the addresses of the GPUs whose VFs were enabled."""
    enabled = []
    for round_ in range(4):
        leaving = [e.plan.address for e in plans if leaves_mig(e.plan)]
        pending = [e.gpu.address for e in plans if e.framework == NEEDS_VFS]
        pending += node.modes.needs_vfs    # claim-time GPUs: VFs only, their types are the DRA driver's
        if not leaving and not (pending and state == "present"):
            return enabled
        if round_ == 3:
            raise LayoutError("GPU %s: still needs its VFs or MIG mode changed after three rounds of doing so"
                              % ", ".join(leaving + pending))
        enabled += node.leave_mig(plans, wait_timeout)
        if pending and state == "present":
            node.mig_before_vfs(plans)
            enabled += node.enable_vfs(pending, wait_timeout)
        plans[:] = node.plan(entries, state, mixed_size, enable_vfs=False, reuse=True)
    return enabled


def _carry_mig_exit(first, plans):
    """A GPU taken out of MIG mode keeps, in the new plan of its VFs, what the first plan said it had
    (VF types, MIG state): the result and diff describe the whole change, as check mode showed it."""
    exits = dict((e.plan.address, e.plan) for e in first if leaves_mig(e.plan))
    for plan in [e.plan for e in plans]:
        old = exits.get(plan.address)
        if old is None or plan is old:
            continue
        had = dict((v.address, v.before) for v in old.vgpus)
        for change in plan.vgpus:
            change.before = had.get(change.address, change.before)
        plan.mig = old.mig


def summarize(plans):
    """The module/CLI result: changed, gpus, resources, diff, warnings."""
    resources = OrderedDict()
    for plan in plans:
        if plan.framework is None:
            continue
        for change in plan.vgpus:
            after = change.after
            if after is None:
                continue
            vendor, device = plan.pci_id.split(":")
            key = (after.short, plan.pci_id)
            if key not in resources:
                resources[key] = OrderedDict([
                    ("profile", after.short), ("type_name", after.name), ("resource_name", vt.resource_name(after.name)),
                    ("pci_vendor_selector", pci.vendor_selector(vendor, device)), ("framework", plan.framework),
                    ("count", 0)])
                if plan.framework == vgpu_mdev.FRAMEWORK:
                    resources[key]["mdev_name_selector"] = after.name
            resources[key]["count"] += 1
    gpus = []
    for plan in plans:
        gpus.append(plan.to_result())
        if plan.mig is not None:
            gpus[-1]["mig"] = plan.mig.state(True)
    return {
        "changed": any(p.changed for p in plans),
        "gpus": gpus,
        "resources": list(resources.values()),
        "diff": diff(plans),
        "warnings": [w for p in plans for w in p.warnings],
    }


def diff(plans):
    """Ansible diff: per GPU, per VF (or mdev uuid) the profile before and after, changed GPUs only."""
    before, after = OrderedDict(), OrderedDict()
    for plan in plans:
        if not plan.changed:
            continue
        if plan.pending is not None:  # VFs not enabled yet: no VF to name, only the GPU and its profiles
            before[plan.address] = OrderedDict([("vfs", "disabled")])
            after[plan.address] = OrderedDict([("vfs", "enabled"), ("profiles", OrderedDict(plan.pending))])
            if mig.pending_state(plan.pending):
                after[plan.address]["mig"] = mig.pending_state(plan.pending)
            continue
        slots_before, slots_after = OrderedDict(), OrderedDict()
        for change in plan.vgpus:
            if change.before is None and change.after is None:
                continue
            key = change.uuid and "%s/%s" % (change.address, change.uuid) or change.address
            slots_before[key] = change.before.short if change.before is not None else None
            slots_after[key] = change.after.short if change.after is not None else None
        if plan.mig is not None:
            slots_before["mig"], slots_after["mig"] = plan.mig.state(False), plan.mig.state(True)
        before[plan.address], after[plan.address] = slots_before, slots_after
    return {"before": before, "after": after}


def check(node, entries):
    """assert: [one-line difference per GPU]; empty when the node matches the layout."""
    try:
        plans = node.plan(entries, "present", mixed_size=True, enable_vfs=True)
    except EngineError as err:
        return [str(err)]
    problems = []
    for entry in plans:
        framework, plan = entry.framework, entry.plan
        if not plan.changed:
            continue
        if framework == NEEDS_VFS:
            problems.append("GPU %s: SR-IOV VFs are not enabled" % plan.address)
            continue
        have = _counts(v.before for v in plan.vgpus)
        wanted = _counts(v.after for v in plan.vgpus)
        line = "GPU %s: has %s, layout wants %s" % (plan.address, _text(have), _text(wanted))
        if plan.mig is not None and plan.mig.changed:
            line += "; MIG %s, layout wants %s" % (_mig_text(plan.mig.state(False)), _mig_text(plan.mig.state(True)))
        problems.append(line)
    problems += ["GPU %s: claim-time mode: SR-IOV VFs are not enabled" % a for a in node.modes.needs_vfs]
    return problems


def _mig_text(state):
    return "mode %s, GPU instances %s" % (state["mode"], ", ".join(state["gpu_instances"]) or "none")


def export(node):
    """{PF address: {profile: count}} for every NVIDIA GPU that offers vGPUs (for `export`)."""
    found = OrderedDict()
    for gpu in nvidia_gpus(node.sysfs):
        try:
            profiles = node.current(gpu)
        except LayoutError:
            continue
        if profiles is not None:
            found[gpu.address] = dict(sorted(profiles.items()))
    return found
