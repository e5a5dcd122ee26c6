# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KubeVirt CR planning: permittedHostDevices entries keyed by resourceName, feature gates, versions.

Everything here is pure: it takes the CR as a dict and returns plain data. The I/O (read, patch,
retry on 409) lives in k8s_write.py, so the merge rules are tested without any server.

Merge rules for `pciHostDevices` and `mediatedDevices` (a JSON merge patch would replace the
lists wholesale and wipe other teams' entries, so we compute the whole new list ourselves and
send it guarded by the resourceVersion we read):
- an entry is *ours* when its resourceName is in the desired list;
- ours are updated in place (unknown extra keys of the existing entry are kept), missing ones are
  appended in the desired order; `state: absent` removes ours;
- with an exclusive vendor (`10DE`) / mdev name prefix, entries of that vendor that are not ours
  (present) are removed; every other entry is kept untouched, in its order.
- one device, one owner: a foreign entry (another resourceName) with the same pciVendorSelector
  (compared case-insensitively) or mdevNameSelector as one of ours would make KubeVirt run two
  device plugins for the same devices (double counting, VMs that fail to start). That fails before
  any write, naming both entries, unless the foreign resourceName is listed in `take_over`: then it
  is removed in the same write (shown in changes and diff, check mode included). Two of our own
  entries with one selector fail the same way.
- what the collection wrote is its own: the annotation OWNED_ANNOTATION on the CR lists the
  resourceNames it added (JSON {"pciHostDevices": [...], "mediatedDevices": [...]}), updated in the same
  write. An entry listed there that carries the selector of a desired entry under another resourceName
  (24Q -> 12Q: same PCI ID) is replaced without take_over; with `prune_owned` every listed entry that
  is no longer desired goes (stale mdev types of earlier profiles included). Entries not listed keep
  the rules above. A CR written before the annotation existed has none: its entries count as foreign
  until take_over replaces them once.
"""

from __future__ import annotations

import copy
import json
import re

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, shown
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_write import K8sError, WritePlan, read_modify_write

GROUP, VERSION, PLURAL, KIND = "kubevirt.io", "v1", "kubevirts", "KubeVirt"
HOST_DEVICES_GATE = "HostDevices"
# kubevirt/kubevirt PR #16890 (nvidia-bound VFs) and PR #18112 (display) shipped together in
# v1.9.0; the backports to 1.6-1.8 are disputed (kubevirt/kubevirt#17642 names 1.6.5, 1.7.3 and 1.8.2;
# NVIDIA/vgpu-device-manager#195 says v1.9.0).
VENDOR_VFIO_MIN_VERSION = "1.9.0"
# An externalResourceProvider pciHostDevices entry (the node agent's device plugin) needs only what
# virt-launcher has had for long: the GPU PCI address pool read from PCI_RESOURCE_<NAME> and a host
# device with managed='no' (pkg/virt-launcher/virtwrap/device/hostdevice/gpu/{addresspool,hostdev}.go,
# checked at v1.0.0, v1.6.0 and v1.9.0); KubeVirt's own discovery, which 1.9.0 taught nvidia-bound VFs,
# is skipped for such entries (pkg/virt-handler/device-manager/device_controller.go:263-270 at v1.9.0).
EXTERNAL_PCI_MIN_VERSION = "1.0.0"
PROVIDERS = ("kubevirt", "agent")
VIRT_HANDLER_ENV = "VIRT_HANDLER_IMAGE"

PCI, MDEV = "pciHostDevices", "mediatedDevices"
OWNED_ANNOTATION = "accelops.io/vgpu.owned-host-devices"
SELECTOR = {PCI: "pciVendorSelector", MDEV: "mdevNameSelector"}
# \Z, not $: `$` also matches before a final newline.
_PCI_SELECTOR_RE = re.compile(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}\Z")
_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


class KubeVirtError(EngineError):
    """A KubeVirt CR or desired entry problem; the message names the object."""


def cr_ref(cr):
    meta = cr.get("metadata") or {}
    return "KubeVirt %s/%s" % (meta.get("namespace"), meta.get("name"))


def select_kubevirt(items, name=None, namespace=None):
    """The one KubeVirt CR among `items` (a LIST result), optionally pinned by name/namespace."""
    found = [cr for cr in items
             if (name is None or cr["metadata"]["name"] == name)
             and (namespace is None or cr["metadata"].get("namespace") == namespace)]
    pinned = "%s/%s" % (shown(namespace or "*"), shown(name or "*"))
    if not found:
        raise KubeVirtError("KubeVirt %s: no KubeVirt CR found (is KubeVirt installed?)" % pinned)
    if len(found) > 1:
        raise KubeVirtError("KubeVirt %s: %d KubeVirt CRs found (%s); set name and namespace to pick one"
                            % (pinned, len(found), ", ".join(cr_ref(cr)[len(KIND) + 1:] for cr in found)))
    return found[0]


def pci_entry(resource_name, pci_vendor_selector=None, external_resource_provider=False):
    """A pciHostDevices entry as KubeVirt spells it (externalResourceProvider only when true)."""
    entry = {"resourceName": resource_name}
    if pci_vendor_selector is not None:
        entry["pciVendorSelector"] = pci_vendor_selector.upper()
    if external_resource_provider:
        entry["externalResourceProvider"] = True
    return entry


def mdev_entry(resource_name, mdev_name_selector=None, external_resource_provider=False):
    entry = {"resourceName": resource_name}
    if mdev_name_selector is not None:
        entry["mdevNameSelector"] = mdev_name_selector
    if external_resource_provider:
        entry["externalResourceProvider"] = True
    return entry


def selector_key(kind, entry):
    """What identifies the devices an entry permits: the PCI ID upper-cased, the mdev name as is."""
    value = entry.get(SELECTOR[kind])
    if not isinstance(value, str) or not value.strip():
        return None
    value = " ".join(value.split())
    return value.upper() if kind == PCI else value


def validate_entries(kind, entries, state):
    """Desired entries of one list: unique resourceNames, selectors present and well formed, and no
    two of them permitting the same devices."""
    seen, selectors = {}, {}
    for entry in entries:
        name = entry.get("resourceName")
        if not name:
            raise KubeVirtError("%s entry %r: resourceName is required" % (kind, entry))
        if name in seen and seen[name] != entry:
            raise KubeVirtError("%s %s: listed twice with different fields" % (kind, shown(name)))
        seen[name] = entry
        if state != "present":
            continue
        selector = entry.get(SELECTOR[kind])
        if not selector:
            raise KubeVirtError("%s %s: %s is required" % (kind, shown(name), SELECTOR[kind]))
        if kind == PCI and not _PCI_SELECTOR_RE.match(selector):
            raise KubeVirtError("%s %s: pciVendorSelector %r is not VVVV:DDDD (e.g. 10DE:26B9)"
                                % (kind, shown(name), selector))
        if entry.get("externalResourceProvider"):
            continue  # KubeVirt runs no plugin and no discovery for it: one selector may carry several names
        other = selectors.setdefault(selector_key(kind, entry), name)
        if other != name:
            raise KubeVirtError("%s: %s %s is listed for both %s and %s; one device can have one resourceName"
                                % (kind, SELECTOR[kind], shown(selector_key(kind, entry)), shown(other), shown(name)))
    return list(seen.values())


def _conflicts(kind, current, desired, exclusive, take_over, where, owned=frozenset()):
    """Foreign entries that permit the devices of one of ours: [(foreign entry, our entry)] for those
    listed in take_over (to be removed); any other such entry is an error naming both. A take_over
    name whose entry permits none of our devices is not ours to remove: it stays."""
    ours = dict((selector_key(kind, e), e) for e in desired if selector_key(kind, e))
    names = set(e["resourceName"] for e in desired)
    taken = []
    for entry in current or []:
        name = entry.get("resourceName")
        mine = ours.get(selector_key(kind, entry))
        if name in names or name in owned or mine is None or (exclusive and _is_exclusive(kind, entry, exclusive)):
            continue
        if _both_external(entry, mine):
            continue  # neither makes KubeVirt advertise the devices
        if name not in take_over:
            raise KubeVirtError(
                "%s %s: %s %s is permitted as %s and would also be as %s (two device plugins advertising the same "
                "devices); list %s in take_over to replace it"
                % (where, kind, SELECTOR[kind], shown(selector_key(kind, entry)), shown(name),
                   shown(mine["resourceName"]), shown(name)))
        taken.append((entry, mine))
    return taken


def _both_external(entry, mine):
    return bool(entry.get("externalResourceProvider")) and bool(mine.get("externalResourceProvider"))


def _vendor(entry):
    return str(entry.get("pciVendorSelector", "")).split(":", 1)[0].upper()


def _is_exclusive(kind, entry, exclusive):
    if kind == PCI:
        return _vendor(entry) in {v.upper() for v in exclusive}
    return any(str(entry.get("mdevNameSelector", "")).startswith(p) for p in exclusive)


def _same(existing, wanted):
    """Equal for KubeVirt: a missing externalResourceProvider means false."""
    def norm(entry):
        out = dict(entry)
        if not out.get("externalResourceProvider"):
            out.pop("externalResourceProvider", None)
        return out
    return norm(existing) == norm(wanted)


def merge_entries(kind, current, desired, state="present", exclusive=(), take_over=(), where="KubeVirt",
                  owned=(), prune_owned=False):
    """(new list, change lines) for one permittedHostDevices list. Pure; inputs are not modified.

    `take_over`: foreign resourceNames that may be replaced by ours with the same selector. `owned`: names
    the collection wrote earlier (OWNED_ANNOTATION), replaced without take_over (see _earlier_own).
    """
    ours = {e["resourceName"]: e for e in desired}
    owned = frozenset(owned) - set(ours)
    taken = _conflicts(kind, current, desired, exclusive, set(take_over), where, owned) if state == "present" else []
    taken = dict((id(entry), mine["resourceName"]) for entry, mine in taken)
    result, changes, done = [], [], set()
    for entry in current or []:
        name = entry.get("resourceName")
        earlier = _earlier_own(kind, entry, owned, desired, state, prune_owned)
        if earlier:
            changes.append("%s: remove %s (%s)" % (kind, name, earlier))
        elif id(entry) in taken:
            changes.append("%s: remove %s (taken over by %s)" % (kind, name, taken[id(entry)]))
        elif name in ours:
            if state == "absent" or name in done:
                changes.append("%s: remove %s" % (kind, name))
                continue
            merged = {k: v for k, v in entry.items() if k != "externalResourceProvider"}
            merged.update(ours[name])
            if _same(entry, merged):
                merged = copy.deepcopy(entry)  # keep an explicit `externalResourceProvider: false`
            else:
                changes.append("%s: update %s" % (kind, name))
            result.append(merged)
            done.add(name)
        elif exclusive and _is_exclusive(kind, entry, exclusive):
            changes.append("%s: remove %s (not ours, exclusive %s)" % (kind, name, _exclusive_label(kind, entry)))
        else:
            result.append(copy.deepcopy(entry))
    if state == "present":
        for name, entry in ours.items():
            if name not in done:
                result.append(dict(entry))
                changes.append("%s: add %s" % (kind, name))
    return result, changes


def _earlier_own(kind, entry, owned, desired, state, prune_owned):
    """Why an entry the collection wrote in an earlier run goes now (None: it stays): replaced by a desired
    entry with its selector, or (prune_owned) no longer desired."""
    name = entry.get("resourceName")
    if name not in owned or state != "present":
        return None
    key = selector_key(kind, entry)
    successor = next((e["resourceName"] for e in desired if key and selector_key(kind, e) == key), None)
    if successor:
        return "ours from an earlier run, replaced by %s" % successor
    return "ours from an earlier run, no longer wanted" if prune_owned else None


def owned_names(cr):
    """{PCI: set, MDEV: set} of the resourceNames OWNED_ANNOTATION lists (empty when absent or unreadable)."""
    text = ((cr.get("metadata") or {}).get("annotations") or {}).get(OWNED_ANNOTATION)
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        value = {}
    value = value if isinstance(value, dict) else {}
    return dict((kind, set(n for n in value.get(kind) or [] if isinstance(n, str))) for kind in (PCI, MDEV))


def owned_after(owned, desired, new_lists, state):
    """The annotation's value after the write: what we own and the new lists still hold (JSON text)."""
    value = {}
    for kind in (PCI, MDEV):
        present = set(e.get("resourceName") for e in new_lists[kind])
        names = set(owned[kind])
        if state == "present":
            names |= set(e["resourceName"] for e in desired[kind])
        else:
            names -= set(e["resourceName"] for e in desired[kind])
        value[kind] = sorted(names & present)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _exclusive_label(kind, entry):
    return "vendor " + _vendor(entry) if kind == PCI else "mdev name"


def merge_feature_gates(current, wanted):
    gates = list(current or [])
    added = [g for g in wanted if g not in gates]
    return gates + added, ["featureGates: add %s" % g for g in added]


def managed_view(cr):
    """The subtree this module manages, for diff before/after."""
    conf = (cr.get("spec") or {}).get("configuration") or {}
    permitted = conf.get("permittedHostDevices") or {}
    return {
        "permittedHostDevices": {PCI: list(permitted.get(PCI) or []), MDEV: list(permitted.get(MDEV) or [])},
        "featureGates": list((conf.get("developerConfiguration") or {}).get("featureGates") or []),
    }


def plan_host_devices(current_cr, pci=(), mdev=(), state="present", exclusive_pci_vendors=(),
                      exclusive_mdev_prefixes=(), feature_gate=True, take_over=(), prune_owned=False):
    """Plan the KubeVirt CR change.

    current_cr: the CR as read (dict). pci / mdev: desired entries in KubeVirt spelling
    (`pci_entry()` / `mdev_entry()`). Returns a WritePlan whose `patch` is a JSON merge
    patch carrying metadata.resourceVersion (so a concurrent writer makes the server answer 409)
    and the complete new lists, or None when the CR already matches. `take_over`: foreign
    resourceNames our entries replace (any other foreign entry with one of our selectors fails).
    `prune_owned`: remove the entries of earlier runs (OWNED_ANNOTATION) that are no longer desired.
    """
    if state not in ("present", "absent"):
        raise KubeVirtError("%s: state must be present or absent, not %r" % (cr_ref(current_cr), state))
    pci = validate_entries(PCI, list(pci), state)
    mdev = validate_entries(MDEV, list(mdev), state)
    before = managed_view(current_cr)
    where = cr_ref(current_cr)
    owned = owned_names(current_cr)
    new_pci, pci_changes = merge_entries(PCI, before["permittedHostDevices"][PCI], pci, state,
                                         exclusive_pci_vendors, take_over, where, owned[PCI], prune_owned)
    new_mdev, mdev_changes = merge_entries(MDEV, before["permittedHostDevices"][MDEV], mdev, state,
                                           exclusive_mdev_prefixes, take_over, where, owned[MDEV], prune_owned)
    wants_gate = feature_gate and state == "present" and (pci or mdev)
    gates, gate_changes = merge_feature_gates(before["featureGates"], [HOST_DEVICES_GATE] if wants_gate else [])
    after = {"permittedHostDevices": {PCI: new_pci, MDEV: new_mdev}, "featureGates": gates}
    changes = pci_changes + mdev_changes + gate_changes
    configuration = {}
    permitted = {}
    if new_pci != before["permittedHostDevices"][PCI]:
        permitted[PCI] = new_pci
    if new_mdev != before["permittedHostDevices"][MDEV]:
        permitted[MDEV] = new_mdev
    if permitted:
        configuration["permittedHostDevices"] = permitted
    if gates != before["featureGates"]:
        configuration["developerConfiguration"] = {"featureGates": gates}
    meta = current_cr.get("metadata") or {}
    owned_text = owned_after(owned, {PCI: pci, MDEV: mdev}, {PCI: new_pci, MDEV: new_mdev}, state)
    annotate = owned_text != (meta.get("annotations") or {}).get(OWNED_ANNOTATION, owned_after(
        {PCI: set(), MDEV: set()}, {PCI: [], MDEV: []}, {PCI: [], MDEV: []}, state))
    patch = None
    if configuration or annotate:
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
        if configuration:
            patch["spec"] = {"configuration": configuration}
        if annotate:
            patch["metadata"]["annotations"] = {OWNED_ANNOTATION: owned_text}
            if not configuration:
                changes.append("annotation %s: %s" % (OWNED_ANNOTATION, owned_text))
    return WritePlan(patch=patch, changes=changes, before=before, after=after)


def parse_version(text):
    """(major, minor, patch) from 'v1.9.0', '1.9.0-rc.1', ...; None when unparseable."""
    match = _VERSION_RE.match(str(text or "").strip())
    return tuple(int(x) for x in match.groups()) if match else None


def deployed_version(cr):
    status = cr.get("status") or {}
    return status.get("observedKubeVirtVersion") or status.get("operatorVersion")


def check_vendor_vfio_version(cr, minimum=VENDOR_VFIO_MIN_VERSION):
    """Fail unless the deployed KubeVirt serves nvidia-bound VFs (>= minimum)."""
    text = deployed_version(cr)
    have, want = parse_version(text), parse_version(minimum)
    if want is None:
        raise KubeVirtError("minimum KubeVirt version %r is not X.Y.Z" % minimum)
    if have is None:
        raise KubeVirtError("%s: deployed version unknown (status.observedKubeVirtVersion=%r); vendor-VFIO "
                            "vGPU needs KubeVirt >= %s (set skip_version_check to proceed)"
                            % (cr_ref(cr), text, minimum))
    if have < want:
        raise KubeVirtError("%s: KubeVirt %s cannot serve nvidia-bound vGPU VFs (needs KubeVirt >= %s); upgrade, "
                            "or set skip_version_check if its virt-handler carries PR #16890"
                            % (cr_ref(cr), text, minimum))
    return text


# --- I/O around the plan (the api object is k8s_client.KubeApi or a test double) -------------

def _desired_from_params(params):
    pci = [pci_entry(e["resource_name"], e.get("pci_vendor_selector"), e.get("external_resource_provider"))
           for e in params.get("pci_host_devices") or []]
    mdev = [mdev_entry(e["resource_name"], e.get("mdev_name_selector"), e.get("external_resource_provider"))
            for e in params.get("mediated_devices") or []]
    vendor_vfio = params.get("state", "present") == "present" and any(
        e.get("vendor_vfio", True) and not e.get("external_resource_provider")
        for e in params.get("pci_host_devices") or [])
    return pci, mdev, vendor_vfio


def _external_pci(params):
    """Whether present entries hand PCI devices to an external device plugin (the agent provider)."""
    return params.get("state", "present") == "present" and any(
        e.get("external_resource_provider") for e in params.get("pci_host_devices") or [])


def check_external_pci_version(cr, minimum=EXTERNAL_PCI_MIN_VERSION):
    """Fail unless the deployed KubeVirt reads externally provided PCI GPUs (>= minimum)."""
    have, text = parse_version(deployed_version(cr)), deployed_version(cr)
    if have is None or have < parse_version(minimum):
        raise KubeVirtError("%s: KubeVirt %s: externalResourceProvider pciHostDevices for vGPUs need KubeVirt >= %s "
                            "(set skip_version_check to proceed)" % (cr_ref(cr), text or "of unknown version", minimum))
    return text


def read_kubevirt(api, name=None, namespace=None):
    """The KubeVirt CR: GET when pinned by name and namespace, else LIST in all namespaces."""
    if name and namespace:
        return api.get_custom("KubeVirt %s/%s" % (namespace, name), GROUP, VERSION, PLURAL, name, namespace)
    try:
        items = api.list_custom("KubeVirt CRs", GROUP, VERSION, PLURAL)
    except K8sError as exc:
        if exc.status == 404:
            raise KubeVirtError("KubeVirt CRD kubevirts.kubevirt.io: not served by the API server (HTTP 404); "
                                "is KubeVirt installed?") from None
        raise
    return select_kubevirt(items, name, namespace)


def plan_virt_handler_image(deployment, image, container="virt-operator"):
    """Set (or with image "" remove) VIRT_HANDLER_IMAGE on the virt-operator container.

    A per-component override: spec.imageRegistry/imageTag of the KubeVirt CR would switch every
    component, while virt-operator reads VIRT_HANDLER_IMAGE for virt-handler alone (brief 7.1).
    The patch is a JSON patch (RFC 6902) on that one env entry, guarded by `test` ops on the
    container's and the entry's names: nothing else of the Deployment is sent, so fields this
    client's model does not know survive, and a Deployment reordered since the read fails the test
    (HTTP 422), which the API layer reports as a conflict to read again.
    """
    meta = deployment.get("metadata") or {}
    what = "Deployment %s/%s" % (meta.get("namespace"), meta.get("name"))
    containers = ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    index = next((i for i, c in enumerate(containers) if c.get("name") == container), None)
    if index is None:
        raise KubeVirtError("%s: no container %r to set VIRT_HANDLER_IMAGE on" % (what, container))
    env = containers[index].get("env")
    at = next((i for i, e in enumerate(env or []) if e.get("name") == VIRT_HANDLER_ENV), None)
    old = env[at].get("value") if at is not None else None
    new = image or None
    if old == new:
        return WritePlan(None, [], {"virtHandlerImage": old}, {"virtHandlerImage": new})
    base = "/spec/template/spec/containers/%d" % index
    patch = [{"op": "test", "path": base + "/name", "value": container}]
    entry = {"name": VIRT_HANDLER_ENV, "value": new}
    if at is not None:
        patch.append({"op": "test", "path": "%s/env/%d/name" % (base, at), "value": VIRT_HANDLER_ENV})
        patch.append({"op": "replace", "path": "%s/env/%d/value" % (base, at), "value": new} if new
                     else {"op": "remove", "path": "%s/env/%d" % (base, at)})
    elif env is None:
        patch.append({"op": "add", "path": base + "/env", "value": [entry]})
    else:
        patch.append({"op": "add", "path": base + "/env/-", "value": entry})
    change = "%s: %s %s" % (what, "set" if new else "remove", VIRT_HANDLER_ENV + ("=" + new if new else ""))
    return WritePlan(patch, [change], {"virtHandlerImage": old}, {"virtHandlerImage": new})


def _run_virt_handler_image(api, params, check_mode, namespace):
    name = params.get("virt_operator_deployment") or "virt-operator"

    def write(current, patch):
        if not (check_mode and params.get("dry_run") == "client"):
            api.patch_deployment(name, namespace, patch, dry_run=check_mode)

    return read_modify_write(lambda: api.get_deployment(name, namespace),
                             lambda dep: plan_virt_handler_image(dep, params["virt_handler_image"]),
                             write, params.get("conflict_retries", 5))[1]


def run_hostdevices(api, params, check_mode):
    """kubevirt_hostdevices: read the CR, plan, write with resourceVersion, retry on 409."""
    pci, mdev, vendor_vfio = _desired_from_params(params)
    warnings = []

    def plan(cr):
        if vendor_vfio or _external_pci(params):
            if params.get("skip_version_check"):
                warnings.append("%s: KubeVirt version check skipped (deployed: %s)" % (cr_ref(cr), deployed_version(cr)))
            elif vendor_vfio:
                check_vendor_vfio_version(cr, params.get("minimum_version") or VENDOR_VFIO_MIN_VERSION)
            else:
                check_external_pci_version(cr)
        return plan_host_devices(cr, pci, mdev, params.get("state", "present"),
                                 params.get("exclusive_pci_vendors") or (),
                                 params.get("exclusive_mdev_prefixes") or (),
                                 params.get("feature_gate", True), params.get("take_over") or (),
                                 params.get("prune_owned", False))

    def write(cr, patch):
        if check_mode and params.get("dry_run") == "client":
            return
        meta = cr["metadata"]
        api.patch_custom(cr_ref(cr), GROUP, VERSION, PLURAL, meta["name"], patch,
                         namespace=meta.get("namespace"), dry_run=check_mode)

    cr, result, attempts = read_modify_write(
        lambda: read_kubevirt(api, params.get("name"), params.get("namespace")), plan, write,
        params.get("conflict_retries", 5))
    meta = cr["metadata"]
    before, after, changes = dict(result.before), dict(result.after), list(result.changes)
    changed = result.changed
    if params.get("virt_handler_image") is not None:
        image = _run_virt_handler_image(api, params, check_mode, meta.get("namespace"))
        before.update(image.before)
        after.update(image.after)
        changes += image.changes
        changed = changed or image.changed
    return {"changed": changed, "changes": changes, "attempts": attempts,
            "kubevirt": {"name": meta["name"], "namespace": meta.get("namespace"), "version": deployed_version(cr)},
            "diff": {"before": before, "after": after}, "warnings": sorted(set(warnings))}


# --- from per-node vgpu_profile results to cluster entries (roles/kubevirt_vgpu) -------------

def model_resource_name(type_name):
    """`NVIDIA L40S-24Q` -> `nvidia.com/NVIDIA_L40S` (the design's Harvester-style spelling)."""
    model = re.sub(r"-(\d+-)?\d+[A-Za-z]+$", "", type_name.strip())
    return "nvidia.com/" + re.sub(r"[\s/.]", "_", model)


def plan_cluster_resources(nodes, naming="profile", mdev_external_provider=True, provider="kubevirt",
                           extra_profiles=()):
    """Cluster entries and node profiles from the nodes' `vgpu_profiles_resources`.

    nodes: [{"name": node, "resources": [vgpu_profile resource dicts] or None}].
    Vendor-VFIO VFs of one GPU model share one PCI ID, so KubeVirt advertises them under one
    resourceName: a node may carry one profile per PCI ID, and with naming=profile the whole
    cluster may (with naming=model the resource is per model and VMs pick the profile by node
    label). mdev types are told apart by mdevNameSelector, so they have no such limit.
    provider=agent: the node agent's device plugin serves every vGPU (one resource per profile, told apart by
    profile, not PCI ID), so each profile gets an `externalResourceProvider: true` entry and the one-profile-per-
    model rules do not apply; `extra_profiles` (resource dicts as vgpu_profile returns them: profile, type_name,
    resource_name, pci_vendor_selector, framework, mdev_name_selector) add the profiles the layouts name that no
    node carries yet, so a VM asking for one is admitted before a relabel converges its node.
    Returns {"errors", "pci_host_devices", "mediated_devices", "nodes", "vendor_vfio"}.
    """
    if provider == "agent":
        return _plan_agent_resources(nodes, naming, extra_profiles)
    if provider != "kubevirt":
        return {"errors": ["provider must be one of %s, not %r" % (", ".join(PROVIDERS), provider)],
                "pci_host_devices": [], "mediated_devices": [], "nodes": [], "vendor_vfio": False}
    errors, pci, mdev, out_nodes = [], {}, {}, []
    by_pci_id = {}  # pci id -> {profile: [nodes]}
    for node in nodes:
        name, resources = node["name"], node.get("resources")
        if resources is None:
            errors.append(_no_results(name))
            continue
        vfio = [r for r in resources if r.get("framework") != "mdev"]
        per_id = {}
        for res in vfio:
            per_id.setdefault(res["pci_vendor_selector"].upper(), []).append(res["profile"])
        for pci_id, profiles in sorted(per_id.items()):
            if len(set(profiles)) > 1:
                errors.append("node %s: GPU model %s carries %d profiles (%s); KubeVirt cannot tell vGPU profiles "
                              "of one PCI ID apart: use one profile per GPU model on a node"
                              % (name, pci_id, len(set(profiles)), ", ".join(sorted(set(profiles)))))
            for profile in set(profiles):
                by_pci_id.setdefault(pci_id, {}).setdefault(profile, []).append(name)
        for res in vfio:
            resource = model_resource_name(res["type_name"]) if naming == "model" else res["resource_name"]
            pci.setdefault(resource, {"pci_vendor_selector": res["pci_vendor_selector"].upper(),
                                      "resource_name": resource, "vendor_vfio": True})
        for res in resources:
            if res.get("framework") == "mdev":
                mdev.setdefault(res["resource_name"], {"mdev_name_selector": res["mdev_name_selector"],
                                                       "resource_name": res["resource_name"],
                                                       "external_resource_provider": bool(mdev_external_provider)})
        out_nodes.append(_node_summary(name, resources))
    if naming == "profile":
        for pci_id, profiles in sorted(by_pci_id.items()):
            if len(profiles) > 1:
                where = ", ".join("%s: %s" % (",".join(sorted(set(n))), p) for p, n in sorted(profiles.items()))
                errors.append("GPU model %s has several profiles across nodes (%s); KubeVirt permits one resource "
                              "per PCI ID: use one profile per model cluster-wide or resource naming 'model'"
                              % (pci_id, where))
    return {"errors": errors, "pci_host_devices": list(pci.values()), "mediated_devices": list(mdev.values()),
            "nodes": out_nodes, "vendor_vfio": bool(pci)}


def _no_results(name):
    return "node %s: no vgpu_profiles_resources (run the vgpu_profiles role on it first)" % name


def _node_summary(name, resources):
    """{"name", "profiles" {profile: count}, "vendor_vfio"} of one node's vgpu_profile resources."""
    profiles = {}
    for res in resources:
        profiles[res["profile"]] = profiles.get(res["profile"], 0) + int(res.get("count") or 0)
    vfio = [r for r in resources if r.get("framework") != "mdev"]
    return {"name": name, "profiles": profiles, "vendor_vfio": bool(vfio) and len(vfio) == len(resources)}


def _plan_agent_resources(nodes, naming, extra_profiles):
    """plan_cluster_resources for provider=agent: external entries, one per profile, no PCI-ID rules."""
    errors, out_nodes = [], []
    if naming != "profile":
        errors.append("provider agent serves one resource per profile: resource naming must be profile, not %r"
                      % naming)
    for node in nodes:
        if node.get("resources") is None:
            errors.append(_no_results(node["name"]))
        else:
            out_nodes.append(_node_summary(node["name"], node["resources"]))
    pci, mdev = {}, {}
    for res in [r for node in nodes for r in node.get("resources") or []] + list(extra_profiles):
        if res.get("framework") == "mdev":
            mdev.setdefault(res["resource_name"], {"mdev_name_selector": res["mdev_name_selector"],
                                                   "resource_name": res["resource_name"],
                                                   "external_resource_provider": True})
        else:
            pci.setdefault(res["resource_name"], {"pci_vendor_selector": res["pci_vendor_selector"].upper(),
                                                  "resource_name": res["resource_name"], "vendor_vfio": True,
                                                  "external_resource_provider": True})
    return {"errors": errors, "pci_host_devices": list(pci.values()), "mediated_devices": list(mdev.values()),
            "nodes": out_nodes, "vendor_vfio": bool(pci)}
