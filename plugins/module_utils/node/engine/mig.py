# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""MIG-backed vGPU on Hopper (vendor-specific VFIO): MIG mode, GPU instances, then the types per VF.

A MIG-backed type (`H100-1-20C`, `H100-3-40C`, `H200X-1-18CME`) owns one MIG GPU instance (GI) of the
profile its name encodes (`<G>-<GB>C[ME]` -> `<G>g.<GB>gb[+me]`, VDM ToMigConfigSpecSlice). Per GPU,
before any write, the plan works out: MIG mode (`nvidia-smi -i <PF> -mig 1`), which GIs to keep,
destroy (`nvidia-smi mig -i <PF> -dci/-dgi -gi <ID>`) and create (`nvidia-smi mig -i <PF> -cgi <IDs> -C`),
and checks that the new GIs fit next to the kept ones. The VF writes stay vgpu_vfio's: the driver
lists a MIG-backed type in `creatable_vgpu_types` only while a free GI of its profile exists and picks
the GI itself; `gpu_instance_id` is read back as an output. Execution per GPU (vgpu_apply): clears,
then this module's steps, then the type writes. What is confirmed and what is not: docs/design.md,
section "MIG-backed vGPU (Hopper)"; every unconfirmed step is an option of MigOptions.

A time-sliced layout on a GPU in MIG mode is one plan too (`leave`): the driver turns MIG mode off
only without VFs and GIs, so the plan clears every vGPU, destroys every GI, disables the VFs, turns
MIG mode off (`nvidia-smi -i <PF> -mig 0`, read back), enables the VFs again and sets the
time-sliced types on them (vgpu_apply runs it, each step verified).

Refused before any write, naming the object: mixing MIG-backed and time-sliced types on one GPU,
a MIG-backed type on a GPU without MIG, MIG mode to switch (either way) while a VM holds a VF,
GIs that do not fit.
"""

from __future__ import annotations

import re
from collections import OrderedDict, namedtuple

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types as vt
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import mig_backed
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.inuse import describe
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError

NVIDIA_SMI = "nvidia-smi"
MODE_ORDERS = ("after-vfs", "before-vfs")
GI_CLEANUPS = ("destroy", "keep")
_SUFFIX = {"ME": "+me", "NOME": "-me", "MEALL": "+me.all", "GFX": "+gfx"}
# Hopper geometry (8 memory, 7 compute slices) for the fit check while MIG mode is still off (the
# driver lists placements only in MIG mode): profile ID -> (compute slices, memory slices, starts,
# max instances). MIG user guide `-lgipp` examples; IDs from public H100 `-lgip` notes (brief 11).
MEMORY_SLICES, COMPUTE_SLICES = 8, 7
HOPPER_GEOMETRY = {19: (1, 1, tuple(range(7)), 7), 20: (1, 1, tuple(range(7)), 1), 15: (1, 2, (0, 2, 4, 6), 4),
                   14: (2, 2, (0, 2, 4), 3), 9: (3, 4, (0, 4), 2), 5: (4, 4, (0,), 1), 0: (7, 8, (0,), 1)}


class MigOptions(namedtuple("MigOptions", "mode_order compute_instances gi_cleanup")):
    """The unconfirmed steps, overridable (docs/design.md):
    - mode_order: `after-vfs` (MIG mode once the VFs exist, as Harvester) or `before-vfs` (cubecos);
    - compute_instances: create one compute instance per GI (`-cgi ... -C`, as mig-parted/VDM);
    - gi_cleanup: `destroy` GIs the layout no longer needs, or `keep` them."""

    __slots__ = ()

    def __new__(cls, mode_order="after-vfs", compute_instances=True, gi_cleanup="destroy"):
        if mode_order not in MODE_ORDERS:
            raise LayoutError("MIG mode order %r is not one of %s" % (mode_order, ", ".join(MODE_ORDERS)))
        if gi_cleanup not in GI_CLEANUPS:
            raise LayoutError("MIG GPU instance cleanup %r is not one of %s" % (gi_cleanup, ", ".join(GI_CLEANUPS)))
        return super().__new__(cls, mode_order, bool(compute_instances), gi_cleanup)


MigType = namedtuple("MigType", "type_id name gi_profile")
GpuInstance = namedtuple("GpuInstance", "gi_id profile_id name start size")


def gi_profile_name(name):
    """`H100-1-20C` -> `1g.20gb`, `H100-1-10CME` -> `1g.10gb+me` (VDM ToMigConfigSpecSlice)."""
    profile = vt.parse_profile(name)
    return "%dg.%dgb%s" % (profile.slices, profile.size_gb, _SUFFIX.get(profile.suffix or "", ""))


def wants_mig(entries):
    return any(mig_backed(p) for entry in entries for p in entry.profiles)


def check_kinds(address, entries):
    """A GPU carries time-sliced or MIG-backed vGPUs, never both: an entry mixing them for one model fails."""
    for entry in entries:
        kinds = OrderedDict()
        for name in entry.profiles:
            try:
                model = vt.parse_profile(name).model.lower()
            except vt.VgpuTypeError:
                continue
            kinds.setdefault(model, {}).setdefault(mig_backed(name), name)
        for both in kinds.values():
            if len(both) == 2:
                raise LayoutError("GPU %s: %s mixes MIG-backed %s and time-sliced %s; a GPU carries one kind of vGPU"
                                  % (address, entry.origin, both[True], both[False]))


# ---- nvidia-smi output ----------------------------------------------------------------------------

def parse_mode(text):
    """`--query-gpu=mig.mode.current --format=csv,noheader`: True, False, or None (no MIG: `[N/A]`)."""
    value = text.strip().splitlines()[-1].strip().lower() if text.strip() else ""
    if value == "enabled":
        return True
    if value == "disabled":
        return False
    if value in ("[n/a]", "n/a", "[not supported]"):
        return None
    raise LayoutError("cannot read the MIG mode from nvidia-smi: %r" % text.strip()[:80])


def parse_supported(text):
    """`nvidia-smi vgpu -s -v`: [MigType] of the types that name a `GPU Instance Profile ID`."""
    found, current = [], {}

    def flush():
        if current.get("id") is not None and current.get("name") and current.get("gi") is not None:
            found.append(MigType(current["id"], current["name"], current["gi"]))

    for raw in str(text or "").splitlines():
        key, sep, value = raw.partition(":")
        key, value = " ".join(key.split()).lower(), value.strip()
        if not sep:
            continue
        if key == "vgpu type id":
            flush()
            current = {"id": _number(value)}
        elif key == "name" and current:
            current["name"] = " ".join(value.split())
        elif key == "gpu instance profile id" and current:
            current["gi"] = _number(value)
    flush()
    return found


def _number(text):
    try:
        return int(text, 0)
    except ValueError:
        return None


_GI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")
_PROFILE_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s")
_PLACEMENT_ROW = re.compile(r"Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,\s]*)\}\s*:\s*(\d+)")


def parse_instances(text):
    """`nvidia-smi mig -lgi` -> [GpuInstance] (name, profile ID, GI ID, placement start:size)."""
    return [GpuInstance(int(m.group(4)), int(m.group(3)), m.group(2), int(m.group(5)), int(m.group(6)))
            for m in (_GI_ROW.match(line.strip()) for line in str(text or "").splitlines()) if m]


def parse_profiles(text):
    """`nvidia-smi mig -lgip` -> {profile ID: (name, free, total)}."""
    return OrderedDict((int(m.group(3)), (m.group(2), int(m.group(4)), int(m.group(5))))
                       for m in (_PROFILE_ROW.match(line.strip()) for line in str(text or "").splitlines()) if m)


def parse_placements(text):
    """`nvidia-smi mig -lgipp` -> {profile ID: (memory slices, (starts))}."""
    result = {}
    for match in _PLACEMENT_ROW.finditer(str(text or "")):
        starts = tuple(int(s) for s in match.group(2).replace(" ", "").split(",") if s)
        result[int(match.group(1))] = (int(match.group(3)), starts)
    return result


_UNREAD = object()   # MIG mode not read yet when a fixed answer was kept


class FixedAnswers(dict):
    """nvidia-smi answers that stay while the driver stays loaded: `vgpu -s -v` (supported types), `mig -lgipp`
    (placements), `mig -lgip` (profiles); {PF: (identity, MIG mode they were read in, {args: output})}. Kept by
    whoever lives across reconciles (the agent: a reconcile holds the node lock, and on 8 GPUs 5 calls each at
    0.3-1 s outlast DRA Prepare's 10 s wait for it). MIG mode and `-lgi` change and are never kept. `identity(pf)`:
    a driver reload (the module's version), a GPU swapped (device ID, driver) or a reboot (boot ID) makes the PF's
    answers stale, and so does a MIG mode read other than theirs (whether `vgpu -s -v` depends on it: UNCONFIRMED)."""


def identity(sysfs, pf, boot_id):
    device = "bus/pci/devices/%s/" % pf
    return (boot_id, sysfs.read_optional("module/nvidia/version"), sysfs.read_optional(device + "device"),
            sysfs.link_name(device + "driver"))


def cached_smi(runner, answers, sysfs, boot_id):
    """A Smi asking the fixed answers once per PF and identity (`answers`: a FixedAnswers kept across engines)."""
    return Smi(runner, answers, lambda pf: identity(sysfs, pf, boot_id))


class Smi:
    """nvidia-smi through the engine's command runner; failures are one line naming the GPU. `fixed`
    (FixedAnswers) with `identity(pf)`: the fixed answers are asked once per PF and identity."""

    def __init__(self, runner, fixed=None, identity=None):
        self.runner = runner
        self.fixed = FixedAnswers() if fixed is None else fixed
        self._identity = identity or (lambda pf: None)
        self.identities = {}    # PF -> its identity, read once per Smi (one engine, one reconcile)
        self.modes = {}      # PF -> the MIG mode this Smi read last

    def identity(self, pf):
        if pf not in self.identities:
            self.identities[pf] = self._identity(pf)
        return self.identities[pf]

    def run_fixed(self, pf, args, what):
        """The output of a fixed-answer call (class FixedAnswers), asked only when not kept for this identity."""
        key = self.identity(pf)
        kept = self.fixed.get(pf)
        if kept is None or kept[0] != key:
            kept = self.fixed[pf] = (key, self.modes.get(pf, _UNREAD), {})
        args = tuple(args)
        if args in kept[2]:
            return kept[2][args]
        out = self.run(pf, args, what)[1]
        if (out or "").strip():    # an empty answer (-lgipp with MIG mode off) is asked again
            kept[2][args] = out
        return out

    def _tool(self):
        tool = self.runner.which(NVIDIA_SMI)
        if not tool:
            raise LayoutError("MIG-backed vGPUs need nvidia-smi, which is not on PATH")
        return tool

    def run(self, pf, args, what, ok_codes=(0,)):
        rc, out, err = self.runner.run([self._tool()] + list(args), check=False)
        if rc not in ok_codes:
            said = " ".join((out or err or "exit %d" % rc).split())[:200]
            raise LayoutError("GPU %s: nvidia-smi %s failed: %s" % (pf, what, said))
        return rc, out

    def mode(self, pf):
        mode = parse_mode(self.run(pf, ["-i", pf, "--query-gpu=mig.mode.current", "--format=csv,noheader"],
                                   "--query-gpu=mig.mode.current")[1])
        kept = self.fixed.get(pf)
        if kept is not None and kept[1] is not _UNREAD and kept[1] != mode:
            self.fixed.pop(pf, None)    # read in the other MIG mode: asked again (the DRA driver's reads share it)
        elif kept is not None:
            self.fixed[pf] = (kept[0], mode, kept[2])
        self.modes[pf] = mode
        return mode

    def supported(self, pf):
        return parse_supported(self.supported_text(pf))

    def supported_text(self, pf):
        return self.run_fixed(pf, ["vgpu", "-s", "-v", "-i", pf], "vgpu -s -v")

    def instances(self, pf):
        rc, out = self.run(pf, ["mig", "-i", pf, "-lgi"], "mig -lgi", ok_codes=(0, 6))
        return [] if rc == 6 else parse_instances(out)   # 6: "No GPU instances found"

    def geometry(self, pf):
        """{profile ID: (compute, memory slices, starts, max)} from -lgipp and -lgip (MIG mode on)."""
        places = parse_placements(self.run_fixed(pf, ["mig", "-i", pf, "-lgipp"], "mig -lgipp"))
        profiles = parse_profiles(self.run_fixed(pf, ["mig", "-i", pf, "-lgip"], "mig -lgip"))
        result = {}
        for profile_id, (name, dummy, total) in profiles.items():
            size, starts = places.get(profile_id, (None, ()))
            compute = int(name.split("g.")[0]) if re.match(r"^\d+g\.", name) else 1
            if size:
                result[profile_id] = (compute, size, starts, total)
        return result


class MigPlan:
    """MIG state of one GPU before and after; `steps` are data (vgpu_apply executes them)."""

    def __init__(self, address, mode, gis, options):
        self.address, self.mode_before, self.gis_before, self.options = address, mode, list(gis), options
        self.mode_after = mode
        self.destroy, self.create = [], []   # GpuInstance, profile IDs
        self.names = {}                      # profile ID -> GI profile name
        self.vf_gi = {}                      # VF -> GI ID its vGPU occupies now
        self.leave = False                   # MIG mode off: VFs disabled and enabled again around it

    @property
    def changed(self):
        return bool(self.destroy or self.create or self.mode_after != self.mode_before)

    def steps(self):
        destroys = [("mig-gi-destroy", self.address, gi.gi_id) for gi in self.destroy]
        if self.leave:
            return destroys + [("disable-vfs", self.address), ("mig-mode", self.address, 0),
                               ("enable-vfs", self.address)]
        return (destroys + ([("mig-mode", self.address, 1)] if self.mode_after and not self.mode_before else [])
                + [("mig-gi-create", self.address, profile_id) for profile_id in self.create])

    def gis_after(self):
        kept = [gi.name for gi in self.gis_before if gi not in self.destroy]
        return sorted(kept + [self.names.get(p, "profile %d" % p) for p in self.create])

    def state(self, after):
        mode = self.mode_after if after else self.mode_before
        return OrderedDict([("mode", "enabled" if mode else "disabled"),
                            ("gpu_instances", self.gis_after() if after else sorted(gi.name for gi in self.gis_before))])


def prepare(sysfs, smi, view, entries, options, names=None):
    """For a vendor-VFIO GPU the layout or the driver shows MIG-backed types on: read the MIG state
    (mode, GIs, which GI each typed VF occupies), add MIG-backed types to the view's catalog (the
    creatable lists show them only in MIG mode), check kinds. None when MIG plays no part."""
    address = view.gpu.address
    if not (wants_mig(entries) or any(mig_backed(t.name) for t in view.catalog.values())):
        return None
    check_kinds(address, entries)
    mode = smi.mode(address)
    if mode is None:  # a profile of this model names a MIG slice the GPU cannot make; other models' are skipped
        model = (view.model or "").lower()
        own = [p for e in entries for p in e.profiles if mig_backed(p) and vt.parse_profile(p).model.lower() == model]
        if own:
            raise LayoutError("GPU %s: profile %s is MIG-backed, but the GPU has no MIG mode" % (address, own[0]))
        return None
    state = MigPlan(address, mode, smi.instances(address) if mode else [], options)
    state.types = dict((t.type_id, t) for t in smi.supported(address))
    for mig_type in state.types.values():
        view.catalog.setdefault(mig_type.type_id, vt.VgpuType(mig_type.type_id, mig_type.name))
    if names is not None:
        names.remember(address, [vt.VgpuType(t.type_id, t.name) for t in state.types.values()])
    for vf, current in view.current.items():
        if current in state.types:
            gi_id = sysfs.read_int(vt.vfio_dir(vf) + "/gpu_instance_id")
            if gi_id is not None:
                state.vf_gi[vf] = gi_id
    return state


def plan(state, gpu_plan, view, smi):
    """GIs and MIG mode for the types `gpu_plan` (vgpu_vfio's) puts on the VFs; adds the steps."""
    address = state.address
    after = [c.after for c in gpu_plan.vgpus if c.after is not None]
    mig_after = [t for t in after if t.type_id in state.types]
    if state.mode_before and len(mig_after) != len(after):
        return _leave(state, gpu_plan, view, next(t for t in after if t.type_id not in state.types).short)
    if mig_after and not state.mode_before:
        if view.held:
            vf, pids = sorted(view.held.items())[0]
            raise LayoutError("GPU %s: MIG mode must be enabled for %s, but VF %s is held by a VM (%s)"
                              % (address, mig_after[0].short, vf, describe(pids)), held=[vf])
        state.mode_after = True
    for mig_type in mig_after:
        state.names[state.types[mig_type.type_id].gi_profile] = gi_profile_name(mig_type.name)
    kept_gis = set(state.vf_gi[c.address] for c in gpu_plan.vgpus
                   if c.after is not None and c.before is not None and c.after.type_id == c.before.type_id
                   and c.address in state.vf_gi)
    need = {}
    for mig_type in mig_after:
        profile_id = state.types[mig_type.type_id].gi_profile
        need[profile_id] = need.get(profile_id, 0) + 1
    for gi in state.gis_before:
        if gi.gi_id in kept_gis:
            need[gi.profile_id] = need.get(gi.profile_id, 0) - 1
    for gi in sorted(state.gis_before, key=lambda g: g.gi_id):
        if gi.gi_id in kept_gis:
            continue
        if need.get(gi.profile_id, 0) > 0:
            need[gi.profile_id] -= 1
        elif state.options.gi_cleanup == "destroy":
            state.destroy.append(gi)
    geometry = smi.geometry(address) if state.mode_before and any(n > 0 for n in need.values()) else HOPPER_GEOMETRY
    state.create = sorted((p for p, n in need.items() for dummy in range(max(n, 0))),
                          key=lambda p: (-geometry.get(p, (0, 0))[1], p))
    _check_fit(state, geometry)
    gpu_plan.mig = state
    gpu_plan.steps.extend(state.steps())
    return state


def _leave(state, gpu_plan, view, timesliced):
    """A time-sliced layout on a GPU in MIG mode: the whole way out of MIG mode as one plan (module
    docstring); the time-sliced `set` steps stay in the plan for the diff and are planned again once
    the VFs are back. Refused before any write when a VM holds a VF of the GPU."""
    if view.held:
        vf, pids = sorted(view.held.items())[0]
        raise LayoutError("GPU %s is in MIG mode; time-sliced %s needs it off, which needs its VFs disabled, but VF "
                          "%s is held by a VM (%s)" % (state.address, timesliced, vf, describe(pids)), held=[vf])
    state.leave, state.mode_after, state.destroy = True, False, sorted(state.gis_before, key=lambda g: g.gi_id)
    clears = [s for s in gpu_plan.steps if s[0] == "clear"]
    gpu_plan.mig = state
    gpu_plan.steps[:] = clears + state.steps() + [s for s in gpu_plan.steps if s[0] != "clear"]
    return state


def _check_fit(state, geometry):
    """Place the new GIs next to the kept ones, largest first (the order `-cgi` gets them in), each
    at its highest free start, as gpusim does (the driver's own choice of placement is UNCONFIRMED)."""
    if not state.create:
        return
    unknown = [p for p in state.create if p not in geometry]
    if unknown:
        raise LayoutError("GPU %s: GPU instance profile %d has no known placement (nvidia-smi mig -lgipp)"
                          % (state.address, unknown[0]))
    kept = [gi for gi in state.gis_before if gi not in state.destroy]
    taken = set(s for gi in kept for s in range(gi.start, gi.start + gi.size))
    compute = sum(geometry.get(gi.profile_id, (1,))[0] for gi in kept)
    counts = {}
    for gi in kept:
        counts[gi.profile_id] = counts.get(gi.profile_id, 0) + 1
    for profile_id in state.create:
        cores, size, starts, total = geometry[profile_id]
        start = next((s for s in reversed(starts) if s + size <= MEMORY_SLICES and not taken & set(range(s, s + size))), None)
        if start is None or compute + cores > COMPUTE_SLICES or counts.get(profile_id, 0) >= total:
            raise LayoutError("GPU %s: GPU instances %s do not fit (%s)"
                              % (state.address, ", ".join(state.gis_after()),
                                 "kept: " + ", ".join(sorted(gi.name for gi in kept)) if kept else "empty GPU"))
        taken |= set(range(start, start + size))
        compute += cores
        counts[profile_id] = counts.get(profile_id, 0) + 1


def execute(smi, state):
    """Destroy GIs (their compute instance first), MIG mode on, create GIs; then read back."""
    address = state.address
    for gi in state.destroy:
        smi.run(address, ["mig", "-i", address, "-dci", "-gi", str(gi.gi_id)], "mig -dci", ok_codes=(0, 1, 6))
        smi.run(address, ["mig", "-i", address, "-dgi", "-gi", str(gi.gi_id)], "mig -dgi -gi %d" % gi.gi_id)
    if state.mode_after and not state.mode_before:
        smi.run(address, ["-i", address, "-mig", "1"], "-mig 1")
        if smi.mode(address) is not True:
            raise LayoutError("GPU %s: MIG mode is still off after nvidia-smi -mig 1 (a pending mode needs a GPU "
                              "reset)" % address)
    if state.create:
        args = ["mig", "-i", address, "-cgi", ",".join(str(p) for p in state.create)]
        smi.run(address, args + (["-C"] if state.options.compute_instances else []), "mig -cgi")
    if state.changed:
        have = sorted(gi.name for gi in smi.instances(address))
        if have != state.gis_after():
            raise LayoutError("GPU %s: after the MIG changes it has GPU instances %s, expected %s"
                              % (address, ", ".join(have) or "none", ", ".join(state.gis_after()) or "none"))


def mode_off(smi, address):
    """`nvidia-smi -i <PF> -mig 0` on a GPU without VFs and GIs, read back."""
    smi.run(address, ["-i", address, "-mig", "0"], "-mig 0")
    if smi.mode(address) is not False:
        raise LayoutError("GPU %s: MIG mode is still on after nvidia-smi -mig 0 (a pending mode needs a GPU reset)"
                          % address)


def check_pending(smi, address, profiles):
    """A GPU whose VFs are not enabled yet (`profiles`: the driver's short names): MIG mode exists and
    the GIs fit an empty GPU (enabling the VFs wipes GIs), before the VFs are enabled."""
    wanted = [(p, n) for p, n in profiles.items() if mig_backed(p) and n]
    if not wanted:
        return
    mode = smi.mode(address)
    if mode is None:
        raise LayoutError("GPU %s: profile %s is MIG-backed, but the GPU has no MIG mode" % (address, wanted[0][0]))
    by_name = dict((vt.short_name(t.name).lower(), t) for t in smi.supported(address))
    state = MigPlan(address, mode, [], MigOptions())
    for profile, count in wanted:
        mig_type = by_name.get(profile.lower())
        if mig_type is None:
            raise LayoutError("GPU %s: nvidia-smi vgpu -s -v names no GPU instance profile for %s" % (address, profile))
        state.names[mig_type.gi_profile] = gi_profile_name(profile)
        state.create += [mig_type.gi_profile] * count
    state.create.sort(key=lambda p: (-HOPPER_GEOMETRY.get(p, (0, 0))[1], p))
    _check_fit(state, HOPPER_GEOMETRY)


def pending_state(profiles):
    """The MIG part of a GPU whose VFs are not enabled yet: {mode, gpu_instances} from the names."""
    gis = sorted(gi_profile_name(p) for p, n in profiles.items() if mig_backed(p) for dummy in range(n))
    return OrderedDict([("mode", "enabled"), ("gpu_instances", gis)]) if gis else None


def facts(smi, pf):
    """{mig_mode, gpu_instances} of a GPU for vgpu_facts; None values where the GPU has no MIG."""
    mode = smi.mode(pf)
    gis = smi.instances(pf) if mode else []
    return {"mig_mode": None if mode is None else ("enabled" if mode else "disabled"),
            "gpu_instances": [OrderedDict([("id", gi.gi_id), ("profile_id", gi.profile_id), ("name", gi.name),
                                           ("placement", "%d:%d" % (gi.start, gi.size))]) for gi in gis]}
