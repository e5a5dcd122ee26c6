# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which GPUs get their vGPU profile at claim time (DRA), declared beside the label-driven layout.

The declaration lives in the same file the agent reads (docs/design.md "Profiles chosen at claim time"):

    version: v1                       # a vgpu-device-manager document; VDM decodes it without strict
    vgpu-configs: {...}               # field checks, so it ignores the extra top-level key
    claim-time:
      - devices: [1] | all            # VDM-style: GPU indices or all; device-filter as in vgpu-configs
        device-filter: "0x26B910DE"
        profiles: [L40S-24Q, L40S-12Q]   # the allow-list; left out: the Q profiles the driver reports
        whole-gpu: true               # opt-in: the GPU may also be given whole to one claim (node/engine/whole_gpu.py)

    {"layout": [...], "claim_time": [{"devices": ["0000:41:00.0"], "profiles": [...]}]}   # the simple form

A GPU that a claim-time entry selects is left out of the reconcile (vgpu_apply.NodeEngine.plan): the layout
never writes its VFs, even when a `devices: all` entry of the label's config selects it too. Its VFs are
typed by the DRA driver's NodePrepareResources (kubelet/dra/claim_time.py) and cleared by its unprepare.
An apply that enables VFs (the agent, the boot unit, vgpu_profile with enable_vfs) enables a claim-time GPU's
VFs too when it has none (a reboot removes them): `Modes.needs_vfs`; the boot unit, which has no declaration,
knows these GPUs from the modes file below (under the kubelet directory: it survives the reboot).

A GPU moves between the two modes only while nothing holds its VFs (inuse.held_devices with every holder
source): `check_moves` compares the declaration with the modes last applied (a small file in the DRA
driver's directory, `claim-time-gpus.json`) and refuses a move naming the GPU, the VF and its holder.

    declaration(document, source) -> Declaration (empty when the document declares nothing)
    Declaration.select(gpus) -> {PF address: allowed profiles (tuple) or None (the driver's Q profiles)}
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict, namedtuple

from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import RENAME, write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import shown
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci, vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, inuse, pf_driver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import claim_time_mig
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import VgpuTypeError, parse_profile
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.vgpu_writer import VgpuWriter, attempt

VDM_KEY, LAYOUT_KEY = "claim-time", "claim_time"
VDM_ENTRY_KEYS = ("devices", "device-filter", "profiles", "whole-gpu")
LAYOUT_ENTRY_KEYS = ("devices", "device_filter", "profiles", "whole_gpu")
MODES_FILE = "claim-time-gpus.json"


class ClaimTimeEntry(namedtuple("ClaimTimeEntry", "origin devices filters profiles whole", defaults=(False,))):
    """`devices` None (all) or indices/addresses; `profiles` a tuple of short profile names or None; `whole`: the
    GPU may be given whole too (issue 42 item 1)."""

    __slots__ = ()

    def selects(self, gpu):
        return vgpu_layout.LayoutEntry(self.origin, self.devices, self.filters, {}, False).selects(gpu)


class Declaration:
    """The claim-time entries of one document (possibly none)."""

    def __init__(self, entries=()):
        self.entries = tuple(entries)

    def __bool__(self):
        return bool(self.entries)

    def select(self, gpus):
        """{PF address: allow-list or None} of the `gpus` (vgpu_layout.Gpu) some entry selects; the last
        selecting entry gives the allow-list (as the last layout entry wins). Listed addresses must exist."""
        chosen = OrderedDict()
        by_address = {gpu.address for gpu in gpus}
        by_index = {gpu.index for gpu in gpus}
        for entry in self.entries:
            for device in entry.devices or ():
                if isinstance(device, str) and device not in by_address:
                    raise LayoutError("%s: devices: %s is not an NVIDIA GPU on this node" % (entry.origin, device))
                if isinstance(device, int) and device not in by_index and entry.origin.startswith(LAYOUT_KEY):
                    raise LayoutError("%s: GPU index %d does not exist on this node" % (entry.origin, device))
        for gpu in gpus:
            for entry in self.entries:
                if entry.selects(gpu):
                    chosen[gpu.address] = entry.profiles
        return chosen

    def whole(self, gpus):
        """The PF addresses of `gpus` whose last selecting entry says `whole-gpu: true`."""
        found = OrderedDict()
        for gpu in gpus:
            for entry in self.entries:
                if entry.selects(gpu):
                    found[gpu.address] = entry.whole
        return [address for address, whole in found.items() if whole]


def _whole(value, origin, key, profiles):
    if not isinstance(value, bool):
        raise LayoutError("%s: %s must be true or false, not %s" % (origin, key, shown(value)))
    if value and any(vgpu_types.mig_backed(profile) for profile in profiles or ()):
        # in MIG mode the GPU's VFs and instances stay: passing it through whole is not offered there (yet)
        raise LayoutError("%s: %s is for time-sliced claim-time GPUs; this entry's profiles are MIG-backed" % (origin, key))
    return value


def _profiles(value, origin):
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
        raise LayoutError("%s: profiles must be a non-empty list of profile names like L40S-24Q" % origin)
    names = []
    for item in value:
        try:
            parsed = parse_profile(item)
        except VgpuTypeError as exc:
            raise LayoutError("%s: %s" % (origin, exc)) from None
        if parsed.mig_backed:   # placed at Prepare (node/engine/claim_time_mig.py)
            name = "%s-%d-%d%s%s" % (parsed.model, parsed.slices, parsed.size_gb, parsed.series, parsed.suffix or "")
        else:
            name = "%s-%d%s" % (parsed.model, parsed.size_gb, parsed.series)
        if name not in names:
            names.append(name)
    claim_time_mig.check_allow(names, origin)
    return tuple(names)


def _entries(value, key, origin_prefix):
    if not isinstance(value, list) or not value:
        raise LayoutError("%s must be a non-empty list of entries" % origin_prefix)
    vdm = key == VDM_KEY
    found = []
    for pos, item in enumerate(value):
        origin = "%s[%d]" % (origin_prefix, pos)
        vgpu_layout._unknown_keys(item, VDM_ENTRY_KEYS if vdm else LAYOUT_ENTRY_KEYS, origin)  # pylint: disable=protected-access
        if "devices" not in item:
            raise LayoutError("%s: devices is required (all, or the GPUs)" % origin)
        if vdm:
            devices = vgpu_layout._vdm_devices(item["devices"], origin)  # pylint: disable=protected-access
        else:
            devices = vgpu_layout._layout_devices(item["devices"], origin)  # pylint: disable=protected-access
        filters = vgpu_layout._filters(item.get("device-filter" if vdm else "device_filter"), origin)  # pylint: disable=protected-access
        whole_key = "whole-gpu" if vdm else "whole_gpu"
        profiles = _profiles(item.get("profiles"), origin)
        found.append(ClaimTimeEntry(origin, devices, filters, profiles,
                                    _whole(item.get(whole_key, False), origin, whole_key, profiles)))
    return found


def declaration(document, source="the file"):
    """The Declaration of a parsed config/layout document; errors name `source` and the entry."""
    if not isinstance(document, dict):
        return Declaration()
    try:
        if VDM_KEY in document:
            return Declaration(_entries(document[VDM_KEY], VDM_KEY, VDM_KEY))
        if LAYOUT_KEY in document:
            return Declaration(_entries(document[LAYOUT_KEY], LAYOUT_KEY, LAYOUT_KEY))
    except LayoutError as exc:
        raise LayoutError("%s: %s" % (source, exc)) from None
    return Declaration()


def without(document):
    """The document without its claim-time key (what the label-driven parser and VDM see)."""
    if isinstance(document, dict) and (VDM_KEY in document or LAYOUT_KEY in document):
        return {key: value for key, value in document.items() if key not in (VDM_KEY, LAYOUT_KEY)}
    return document


# --- moves between the modes ---------------------------------------------------------------------------

def modes_path(kubelet_dir=claim_holders.DEFAULT_KUBELET_DIR):
    return os.path.join(claim_holders.plugin_dir(kubelet_dir or claim_holders.DEFAULT_KUBELET_DIR), MODES_FILE)


def read_modes(path):
    """The PF addresses that were claim-time when the modes were last applied; no file: none."""
    try:
        with open(path) as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise LayoutError("claim-time modes file %s cannot be read: %s" % (path, exc)) from None
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(gpus, list) or not all(isinstance(item, str) for item in gpus):
        raise LayoutError("claim-time modes file %s: not {\"gpus\": [PCI address, ...]}" % path)
    return gpus


def write_modes(path, addresses):
    text = json.dumps({"gpus": sorted(addresses)}, sort_keys=True) + "\n"
    try:
        with open(path) as handle:
            if handle.read() == text:
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_file(path, text, 0o644, sync=RENAME)


def check_moves(sysfs, before, after, held, vfs_of):
    """LayoutError naming the first GPU that changes mode (`before`/`after`: claim-time PF addresses) while a
    VF of it is held (`held`: inuse.held_devices; `vfs_of`: {PF: [VF]})."""
    for address in sorted(set(before) ^ set(after)):
        for vf in vfs_of.get(address) or ():
            found = inuse.holders(held, vf, inuse.mdev_parents(sysfs) if sysfs is not None else None)
            if found:
                direction = "into" if address in after else "out of"
                raise LayoutError("GPU %s: cannot move %s claim-time mode while VF %s is held by %s; move it once "
                                  "nothing uses its vGPUs" % (address, direction, vf, inuse.describe(found)),
                                  held=[vf])


def _check_whole_moves(before, after, given):
    """LayoutError naming a GPU given whole to a claim that would leave claim-time mode (the layout would find it on
    vfio-pci without VFs)."""
    for address in sorted(set(before) - set(after)):
        if address in given:
            raise LayoutError("GPU %s: cannot move out of claim-time mode while it is given whole to %s; move it once "
                              "that claim is gone" % (address, given[address][0]))


class Modes:
    """What one plan found: the claim-time GPUs, the moves, the stale types to clear, the prepared claims' types to
    restore, the GPUs passed through (see `plan`)."""

    def __init__(self, gpus=None, before=(), stale=(), restore=None, reserved=(), recheck=None):
        self.gpus = OrderedDict(gpus or {})     # PF address -> allow-list or None
        self.before = list(before)
        self.stale = list(stale)                # VFs of claim-time GPUs with a type nobody holds
        self.restore = OrderedDict(restore or {})   # VF -> type ID of the prepared claim that holds it, reset
        self.reserved = list(reserved)          # pf_driver.Skipped: claim-time GPUs passed through, offering nothing
        self.recheck = recheck                  # inuse.Holders.recheck: asked right before each write of `finish`
        self.claims = {}                        # VF of `restore` -> the claims holding it, whose type is restored
        self.offers = {}                        # PF address -> {model, vfs, profiles: offers()}
        self.needs_vfs = []                     # claim-time GPUs without VFs that the apply enables first
        self.warnings = []
        self.whole = []                         # claim-time GPUs declared whole-gpu: their whole device is published
        self.held_whole = {}                    # PF -> (claim, record): given whole by a DRA claim (node/engine/whole_gpu.py)

    def offerable(self):
        """(address, allow-list) of the claim-time GPUs that may offer profiles (not passed through)."""
        skipped = {s.address for s in self.reserved} | set(self.held_whole)   # held whole: offers as recorded
        return [(address, allow) for address, allow in self.gpus.items() if address not in skipped]

    @property
    def changed(self):
        return bool(self.stale or self.restore)

    def result(self):
        """The apply result's `claim_time`: per GPU its address, model, VF count and offered profiles."""
        found = []
        reserved = {s.address: s.reason for s in self.reserved}
        for address, allow in self.gpus.items():
            offer = self.offers.get(address) or {"model": None, "vfs": 0, "profiles": []}
            found.append({"address": address, "allow": list(allow) if allow else None, "model": offer["model"],
                          "vfs": offer["vfs"], "profiles": offer["profiles"]})
            if address in reserved:
                found[-1]["reserved"] = reserved[address]
            if offer.get("mig"):     # a MIG claim-time GPU: placements (node/engine/claim_time_mig.py)
                found[-1]["mig"] = offer["mig"]
            if address in self.whole:
                found[-1]["whole_gpu"] = True
            if address in self.held_whole:
                holder, record = self.held_whole[address]
                found[-1]["held_whole"] = {"by": holder, "step": record.get("step")}
        return found


def held_whole_at(modes_file):
    """claim_holders.held_whole of the checkpoint beside `modes_file` (the DRA driver's directory)."""
    return claim_holders.held_whole(claim_holders.read_claims(claim_holders.checkpoint_path(os.path.dirname(modes_file))))


def plan(sysfs, declaration_, gpus, modes_file, held_of, vfs_of, recheck=None, boot_id=None):
    """Modes for one reconcile (under the node lock, before any write): which GPUs are claim-time, refused
    moves (LayoutError), the VFs of claim-time GPUs that carry a type no holder explains (left by the
    layout before the move, or by a boot-time apply that predates it): those are cleared, and the VFs that
    prepared DRA claims hold but that lost their type (a vGPU-manager restart resets every VF): the type the
    checkpoint recorded for the claim is written again, when nothing but prepared claims holds the VF (a VF a
    process or a device plugin allocation holds is never written: a warning names it), the claim was prepared in
    this boot (`boot_id`, claim_holders.read_boot_id; after a reboot the kubelet prepares its claims again) and the
    VF can create that type now (its creatable list: another GPU in the slot, or a mode the restart reset, would
    make the write fail on every reconcile; a warning names the VF and the type). A VF whose type cannot be read
    (no nvidia/ directory for a moment after a vGPU-manager restart) is never written; a warning names it when a
    claim holds it. Nothing else is written. A claim-time GPU passed through (bound to vfio-pci or another driver
    than nvidia, node/holders/pf_driver.py) is reserved: it offers nothing and none of its VFs is written.
    `held_of(addresses)` is the engine's held_devices for those PFs; `recheck(names)` its O(1) re-check
    (inuse.Holders.recheck), asked right before each of `finish`'s writes. `declaration_` None: the caller
    declares nothing (the node CLI, the boot unit, the module): the GPUs recorded as claim-time stay so."""
    before = read_modes(modes_file)
    if declaration_ is None:   # a caller without a declaration (CLI, boot unit, module) keeps the agent's modes
        present = {gpu.address for gpu in gpus}
        chosen = OrderedDict((address, None) for address in before if address in present)
    else:
        chosen = declaration_.select(gpus)
    if not chosen and not before:
        return Modes()
    gpus_here = sorted(set(chosen) | set(before))
    held = held_of(gpus_here + [vf for address in gpus_here for vf in vfs_of.get(address) or ()])
    check_moves(sysfs, before, chosen, held, vfs_of)
    given = held_whole_at(modes_file)
    given = {address: given[address] for address in gpus_here if address in given}
    _check_whole_moves(before, chosen, given)
    parents = inuse.mdev_parents(sysfs)
    # a GPU our Prepare gave whole (on vfio-pci, VFs off) is the claim's, not reserved by an operator: left alone
    reserved = pf_driver.skipped(sysfs, [pci.PciDevice(sysfs, address) for address in chosen if address not in given])
    reserved = [s._replace(reason="%s; as a claim-time GPU it offers no vGPU" % s.reason) for s in reserved]
    passed_through = {s.address for s in reserved}
    claimed, placed = None, set()
    stale, restore, warnings, claims = [], OrderedDict(), [], {}
    for address in chosen:
        if address in passed_through or address in given:
            continue
        for vf in vfs_of.get(address) or ():
            current = vgpu_types.read_current(sysfs, vf)
            found = inuse.holders(held, vf, parents)
            by_claims = [h for h in found if claim_holders.is_claim_holder(h)]
            if current and not found:
                stale.append(vf)
            elif current is None and by_claims:
                warnings.append("GPU %s: VF %s of %s: %s; not written" % (
                    address, vf, inuse.describe(by_claims), UNREADABLE))
            elif current == 0 and by_claims:
                if claimed is None:
                    recorded = claim_holders.read_claims(claim_holders.checkpoint_path(os.path.dirname(modes_file)))
                    claimed = claim_holders.claimed_types(recorded, boot_id)
                    placed = claim_holders.placed(recorded)
                type_id = claimed.get(vf)
                others = [h for h in found if not claim_holders.is_claim_holder(h)]
                if type_id and others:
                    warnings.append("GPU %s: VF %s of %s lost its type %d (a vGPU-manager restart?) and is held by "
                                    "%s too: not written" % (address, vf, inuse.describe(by_claims), type_id,
                                                             inuse.describe(others)))
                elif type_id and vf in placed:
                    # the driver puts a MIG-backed vGPU on any free GI of its profile (kubelet/dra/claim_time_mig.py):
                    # written back, it could land on a GI that is not the claim's (another claim's, an operator's)
                    warnings.append("GPU %s: VF %s of %s lost its MIG-backed type %d (a vGPU-manager restart?): not "
                                    "written back, the driver would not put it on the GPU instance the claim created"
                                    % (address, vf, inuse.describe(by_claims), type_id))
                elif type_id:
                    why = _not_writable(sysfs, vf, type_id)
                    if why:
                        warnings.append("GPU %s: VF %s of %s: %s; not written" % (
                            address, vf, inuse.describe(by_claims), why))
                    else:
                        restore[vf] = type_id
                        claims[vf] = tuple(by_claims)
    modes = Modes(chosen, before, stale, restore, reserved, recheck)
    modes.claims = claims
    # held whole: its device stays published while the claim has it, declared or not (the counter stays charged)
    modes.whole = sorted(set(declaration_.whole(gpus) if declaration_ is not None else ()) | set(given))
    modes.held_whole = given
    for address, (dummy, record) in given.items():   # published as when it was given: its VFs are off now
        modes.offers[address] = dict(record.get("offers") or {"model": None, "vfs": 0, "profiles": []})
    modes.warnings.extend(warnings)
    return modes


UNREADABLE = "its vGPU type cannot be read (no nvidia/ directory: the vGPU manager restarting?)"


def _not_writable(sysfs, vf, value):
    """Why `value` cannot be written to the VF's current_vgpu_type now (None: it can): its type cannot be read,
    or the type (not 0) is not in its creatable list (the driver would refuse it: EINVAL)."""
    if vgpu_types.read_current(sysfs, vf) is None:
        return UNREADABLE
    if value:
        try:
            creatable = {t.type_id for t in vgpu_types.read_creatable(sysfs, vf)}
        except VgpuTypeError as exc:
            return "its creatable list cannot be read (%s)" % exc
        if value not in creatable:
            return "type %d is not creatable on it now (another GPU, or a mode the restart reset?)" % value
    return None


def finish(sysfs, modes, modes_file, record=None):
    """After the layout's writes: clear the stale types, give the prepared claims their types back, record the
    modes applied. A VF whose type cannot be read now or that cannot create the type any more is left alone (a
    warning naming the VF); each write goes through the vGPU writer (node/engine/vgpu_writer.py; `record`: the device
    plugin's allocation record), which asks the VF again right before it: one a process opened since the plan, or
    a claim prepared on a stale VF meanwhile, is left alone too (a warning). The rest goes on."""
    writer = VgpuWriter(sysfs, modes.recheck, record)
    for vf, value in [(vf, 0) for vf in modes.stale] + list(modes.restore.items()):
        why = _not_writable(sysfs, vf, value)
        if why:
            modes.warnings.append("VF %s: %s; its type is left as it is" % (vf, why))
            continue
        # a restore acts for the claims that hold the VF (plan), a clear for nobody
        warning = attempt(lambda: writer.set_type(vf, value, acting_for=modes.claims.get(vf, ()) if value else ()),
                          held=lambda who: "VF %s: held by %s since the plan; its type is left as it is" % (vf, who))
        if warning:
            modes.warnings.append(warning)
    if modes.gpus or modes.before:
        write_modes(modes_file, list(modes.gpus))


# --- what a claim-time GPU can offer ---------------------------------------------------------------------

_TYPE_BLOCK = re.compile(r"vGPU Type ID\s*:\s*(\S+)(.*?)(?=vGPU Type ID|\Z)", re.IGNORECASE | re.DOTALL)
_MAX_INSTANCES = re.compile(r"^\s*Max Instances\s*:\s*(\d+)\s*$", re.IGNORECASE | re.MULTILINE)


def parse_max_instances(text):
    """`nvidia-smi vgpu -s -v` output -> {type ID: Max Instances} (the per-GPU maximum of each type)."""
    found = {}
    for type_id, body in _TYPE_BLOCK.findall(str(text or "")):
        match = _MAX_INSTANCES.search(body)
        try:
            if match:
                found[int(type_id, 0)] = int(match.group(1))
        except ValueError:
            continue
    return found


def max_instances(runner, pf, smi="nvidia-smi"):
    """{type ID: max instances} the driver reports for the GPU (`nvidia-smi vgpu -s -v -i <PF>`); {} unknown."""
    tool = runner.which(smi) if runner else None
    if not tool:
        return {}
    rc, out, dummy = runner.run([tool, "vgpu", "-s", "-v", "-i", pf], check=False)
    return parse_max_instances(out) if rc == 0 else {}


def offers(view, allow, maxima):
    """[{profile, type_name, type_id, size_mib, max_instances}] a claim-time GPU offers, from its type catalog
    (`view`: vgpu_vfio.VfioGpu), the allow-list (None: every time-sliced Q profile) and the driver's maxima
    ({type ID: n}; unknown: framebuffer / size), capped by the GPU's VFs. An allowed profile the GPU does not
    offer is an error naming the GPU and the profile."""
    address, total = view.gpu.address, view.total_gb()
    catalog = sorted(view.catalog.values(), key=lambda t: (-(vgpu_layout.type_size_gb(t) or 0), t.type_id))
    if allow is None:
        chosen = []
        for vgpu_type in catalog:
            try:
                parsed = parse_profile(vgpu_type.name)
            except VgpuTypeError:
                continue
            if parsed.series == "Q" and not parsed.mig_backed and not parsed.suffix:
                chosen.append(vgpu_type)
    else:
        chosen = []
        for profile in allow:
            found = vgpu_types.find_type(profile, catalog)
            if found is None:
                raise LayoutError("GPU %s (%s): claim-time profile %s %s" % (
                    address, view.model or "unknown model", profile, vgpu_layout._why_unknown(profile, view.model)))  # pylint: disable=protected-access
            chosen.append(found)
    result = []
    for vgpu_type in chosen:
        size = vgpu_layout.type_size_gb(vgpu_type)
        most = maxima.get(vgpu_type.type_id) or ((total // size) if total and size else 1)
        result.append({"profile": vgpu_type.short, "type_name": vgpu_type.name, "type_id": vgpu_type.type_id,
                       "size_mib": (size or 0) * 1024, "max_instances": max(1, min(most, len(view.vfs)))})
    return result
