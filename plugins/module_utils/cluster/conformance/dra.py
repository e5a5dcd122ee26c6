# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The DRA side of a conformance run (resource.k8s.io/v1) as pure functions: slices and claims in, rows out.

`consistency.dra` reports which DeviceClasses and ResourceSlices exist for GPUs next to the device-plugin
resources. When this collection's driver (`vgpu.accelops.io`) publishes vGPUs and the DeviceClass the run
uses exists, the sharing and over-allocation checks run a second time through ResourceClaims:

- `sharing.dra`: per profile, on the node with the most published devices of it, one claim per device
  (`exactly: {deviceClassName, count: 1, selectors: [profile CEL]}`) and one VMI per claim
  (`spec.resourceClaims` + `gpus[].claimName/requestName`). PASS when every VMI runs on that node and the
  claims' `status.allocation` names distinct published devices of the profile there, two of them on one
  physical GPU (the device's `parentGPU` attribute): unlike the device-plugin path, the allocation says
  which vGPU each VM got, so no pigeonhole is needed.
- `over-allocation.dra`: one claim (and VMI) more than the node's devices of the profile; the scheduler
  must leave the claim unallocated and the VMI unscheduled for the whole window.

Claim-time GPUs (issue 33; kubelet/dra/claim_time.py) publish one multi-allocatable device per GPU and profile
(`claimTime: true`, `allowMultipleAllocations`, capacity `instances`, no VF yet): such a device serves up to
`instances` claims, each allocation with its own `shareID`, and the GPU's counter keeps every other profile off it
while one is allocated. The rows run through them the same way: the plan counts `instances` per claim-time device
(the profile's maximum on each GPU the node offers it on), sharing.dra PASSes when the claims got distinct instances
(shareIDs) of claim-time devices of the profile, two on one physical GPU, and over-allocation.dra when the claim
beyond the instances stays unallocated. That the VF is typed at prepare and cleared at unprepare is the node's
side (tests/integration/dra/test_claim_time_examples.py); the cluster shows the allocation only.
MIG-backed placements at claim time (issue 42.2; kubelet/dra/claim_time_mig.py) are one-claim devices that draw on
the GPU's counters: the plan counts as many of a profile's placements as the counters let be allocated at once
(`packed`), so the claim beyond them is the over-allocation.

- `exclusion.dra` (issue 42.1; kubelet/dra/whole_gpu.py): on one GPU that publishes a whole-GPU device
  (`wholeGPU: true`, profile `whole`) beside claim-time profile devices, a claim for the whole GPU is allocated
  and its VMI runs; then a claim for a vGPU of that GPU (CEL on `parentGPU`) must stay unallocated and its VMI
  unscheduled for the window; both go, and the same the other way round (a vGPU claim first, then the whole GPU).
  PASS when both second claims stayed unallocated: the GPU's counter is never given whole and as vGPUs at once.

The scheduler reads a pool from the slices of its highest `pool.generation` only, and allocates from a
pool once all `resourceSliceCount` slices of that generation are there (k8s.io/dynamic-resource-allocation
structured allocator); the plan counts the same devices.
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance.checks import (
    FAIL, HOSTNAME_LABEL, KAR_SHARING, KAR_VIRTUALIZED, PASS, UNKNOWN, Check, is_running, node_labels, node_of,
    unschedulable, vmi_names)

DRA_VGPU_DRIVER = "vgpu.accelops.io"   # this collection's DRA driver (plugins/module_utils/kubelet/dra)
DEFAULT_DEVICE_CLASS = DRA_VGPU_DRIVER  # the DeviceClass of every vGPU the node agent role creates
SHARING, OVERALLOCATION, EXCLUSION = "sharing.dra", "over-allocation.dra", "exclusion.dra"
WHOLE = "whole"     # the profile attribute of a whole-GPU device (kubelet/dra/whole_gpu.py PROFILE)
VMI_PREFIX = "vgpu-conformance-dra"


def _gpu_device_class(device_class):
    text = str(device_class).lower()
    return "gpu" in text or "nvidia" in text


def _attribute(device, name, driver=DRA_VGPU_DRIVER):
    """A device attribute's value; an unqualified name is in the driver's domain (resource.k8s.io/v1)."""
    attributes = device.get("attributes") or {}
    value = attributes.get(name) or attributes.get("%s/%s" % (driver, name)) or {}
    return next(iter(value.values()), None) if isinstance(value, dict) and value else None


def claim_time(device):
    """Whether a published device is a claim-time profile device (kubelet/dra/claim_time.py ProfileDevice)."""
    return bool(device.get("allowMultipleAllocations")) and _attribute(device, "claimTime") is True


def slots(device):
    """How many claims a device can serve: a claim-time device's `instances` capacity, else 1."""
    if not claim_time(device):
        return 1
    value = ((device.get("capacity") or {}).get("instances") or {}).get("value")
    try:
        return max(int(str(value)), 0)
    except ValueError:
        return 0


def _count(value):
    try:
        return int(str((value or {}).get("value")))
    except ValueError:
        return None


def packed(devices, counters):
    """How many of `devices` (one claim each) the pool's counter sets (`counters`: {set: {counter: {value}}}) let
    the scheduler allocate at once, first fit in name order as it tries them: MIG-backed placements of one profile
    (kubelet/dra/claim_time_mig.py) share memory slices and a limited profile's instance counter, so a profile's 7
    `1g.10gb+me` placements serve one claim. A counter that is not a plain number does not limit here."""
    left = {name: {counter: _count(value) for counter, value in found.items()} for name, found in counters.items()}
    count = 0
    for device in sorted(devices, key=lambda d: str(d.get("name"))):
        need = [(draw.get("counterSet"), counter, _count(value)) for draw in device.get("consumesCounters") or ()
                for counter, value in (draw.get("counters") or {}).items()]
        need = [(name, counter, n) for name, counter, n in need
                if n is not None and (left.get(name) or {}).get(counter) is not None]
        if all(left[name][counter] >= n for name, counter, n in need):
            for name, counter, n in need:
                left[name][counter] -= n
            count += 1
    return count


def newest_pools(resource_slices, driver=DRA_VGPU_DRIVER):
    """{(node, pool): {"generation", "complete", "devices"}} of `driver`: the slices of each pool's highest
    generation, complete when resourceSliceCount of them are there."""
    pools = {}
    for item in resource_slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool = spec.get("pool") or {}
        key = (str(spec.get("nodeName")), pool.get("name"))
        generation = int(pool.get("generation") or 0)
        current = pools.get(key)
        if current is None or generation > current["generation"]:
            current = pools[key] = {"generation": generation, "slices": 0, "devices": [], "counters": {},
                                    "expected": int(pool.get("resourceSliceCount") or 1)}
        if generation == current["generation"]:
            current["slices"] += 1
            current["devices"] += list(spec.get("devices") or ())
            for counter_set in spec.get("sharedCounters") or ():
                current["counters"][counter_set.get("name")] = counter_set.get("counters") or {}
    for entry in pools.values():
        entry["complete"] = entry.pop("slices") >= entry.pop("expected")
    return pools


def dra_vgpus(resource_slices):
    """{node: {profile: count}} of the vGPUs the accelops DRA driver publishes (the newest generation of each
    pool counts, as the scheduler reads pools)."""
    counts = {}
    for (node, _pool), entry in sorted(newest_pools(resource_slices).items()):
        for device in entry["devices"]:
            profile = _attribute(device, "profile") or "unknown"
            per_node = counts.setdefault(node, {})
            per_node[profile] = per_node.get(profile, 0) + 1
    return counts


def dra_gpus(resource_slices):
    """{node: {physical GPU}} whose vGPUs the accelops DRA driver publishes (parentGPU; the newest generation): an
    agent that splits its GPUs between its device plugin and DRA offers none of theirs as extended resources."""
    gpus = {}
    for (node, _pool), entry in sorted(newest_pools(resource_slices).items()):
        gpus.setdefault(node, set()).update(g for g in (_attribute(d, "parentGPU") for d in entry["devices"]) if g)
    return gpus


def dra_check(served, device_classes, resource_slices):
    """resource.k8s.io/v1 DeviceClasses for GPUs next to the device-plugin resources (KAR-0004). Never FAIL:
    DRA is an alternative way to the same vGPUs (docs/design.md "DRA driver").

    served: True, False (404) or a one-line reason why it could not be read (e.g. forbidden).
    """
    if served is not True:
        why = "resource.k8s.io/v1 is not served by this cluster" if served is False else served
        return Check("consistency.dra", KAR_VIRTUALIZED, "resource.k8s.io/v1", UNKNOWN, why + "; vGPUs are offered "
                     "through device-plugin resources only", {"served": served is True})
    gpu_classes = sorted(c["metadata"]["name"] for c in device_classes if _gpu_device_class(c))
    drivers = sorted(set(str((s.get("spec") or {}).get("driver")) for s in resource_slices if _gpu_device_class(s)))
    vgpus = dra_vgpus(resource_slices)
    details = {"served": True, "device_classes": gpu_classes, "resource_slice_drivers": drivers, "vgpus": vgpus}
    if not gpu_classes:
        return Check("consistency.dra", KAR_VIRTUALIZED, "resource.k8s.io/v1", UNKNOWN, "served, but no DeviceClass for "
                     "GPUs (NVIDIA's DRA driver does not publish vGPUs yet); device-plugin resources used", details)
    published = "; %s publishes %s" % (DRA_VGPU_DRIVER, ", ".join(
        "%s: %s" % (node, ", ".join("%d x %s" % (n, p) for p, n in sorted(profiles.items())))
        for node, profiles in sorted(vgpus.items()))) if vgpus else ""
    return Check("consistency.dra", KAR_VIRTUALIZED, "resource.k8s.io/v1", PASS, "DeviceClass(es) for GPUs: %s%s%s" % (
        ", ".join(gpu_classes), "; ResourceSlice drivers: %s" % ", ".join(drivers) if drivers else "", published),
        details)


# --- can the claims run at all -----------------------------------------------------------------

def unavailable(served, device_classes, resource_slices, device_class):
    """Why the checks through claims cannot run (one line), None when they can."""
    if served is not True:
        return ("resource.k8s.io/v1 is not served by this cluster" if served is False else served) + \
            ": vGPUs cannot be claimed through DRA"
    if not newest_pools(resource_slices):
        return ("%s publishes no ResourceSlice: its DRA driver does not serve (the node agent's "
                "vgpu_node_agent_dra)" % DRA_VGPU_DRIVER)
    if device_class not in [c["metadata"]["name"] for c in device_classes]:
        return ("DeviceClass %s does not exist (the vgpu_node_agent role creates %s with vgpu_node_agent_dra; "
                "or set dra_device_class)" % (device_class, DEFAULT_DEVICE_CLASS))
    return None


def unavailable_rows(why):
    """The two DRA workload rows of a run that cannot claim (subject: the driver)."""
    return [Check(check, KAR_SHARING, DRA_VGPU_DRIVER, UNKNOWN, why, {}) for check in (SHARING, OVERALLOCATION)]


def not_run_rows(plan_or_profile, why):
    """The DRA workload rows of a profile that was not exercised (check mode, no device of it)."""
    if isinstance(plan_or_profile, dict):
        subject = "%s@%s" % (plan_or_profile["profile"], plan_or_profile["node"])
    else:
        subject = plan_or_profile
    return [Check(check, KAR_SHARING, subject, UNKNOWN, why, {}) for check in (SHARING, OVERALLOCATION)]


# --- planning ----------------------------------------------------------------------------------

def plan_workloads(profiles, resource_slices, nodes, device_class):
    """One claim workload per profile: the node whose complete pools can serve the most claims of it (a device one,
    a claim-time device its `instances`).

    Returns [{"profile", "node", "hostname", "count", "device_class", "driver", "devices", "gpus",
    "physical_gpus", "claim_time"}] (devices: {(pool, device): parent GPU}; claim_time: {(pool, device): instances}
    of the claim-time devices among them) and the profiles no node publishes.
    """
    by_name = dict((n["metadata"]["name"], n) for n in nodes)
    per_node, shared, drawing, counters = {}, {}, {}, {}
    for (node, pool), entry in newest_pools(resource_slices).items():
        if not entry["complete"]:
            continue
        counters[(node, pool)] = entry["counters"]
        for device in entry["devices"]:
            profile = _attribute(device, "profile")
            per_node.setdefault((profile, node), {})[(pool, device.get("name"))] = _attribute(device, "parentGPU")
            if claim_time(device):
                shared.setdefault((profile, node), {})[(pool, device.get("name"))] = slots(device)
            elif device.get("consumesCounters"):    # one claim each, as far as the counters let (packed)
                drawing.setdefault((profile, node), {}).setdefault(pool, []).append(device)
    plans, missing = [], []
    for profile in profiles:
        def capacity(node):
            devices = per_node[(profile, node)]
            by_pool = drawing.get((profile, node)) or {}
            limited = sum(len(found) - packed(found, counters[(node, pool)]) for pool, found in by_pool.items())
            return len(devices) - limited + sum(n - 1 for n in (shared.get((profile, node)) or {}).values())
        candidates = sorted(((-capacity(node), node) for (p, node) in per_node if p == profile))
        if not candidates or not candidates[0][0]:
            missing.append(profile)
            continue
        node = candidates[0][1]
        devices = per_node[(profile, node)]
        gpus = sorted(set(str(g) for g in devices.values() if g))
        plans.append({"profile": profile, "node": node, "count": -candidates[0][0], "device_class": device_class,
                      "hostname": node_labels(by_name.get(node) or {}).get(HOSTNAME_LABEL, node),
                      "driver": DRA_VGPU_DRIVER, "devices": devices, "gpus": gpus, "physical_gpus": len(gpus),
                      "claim_time": dict(shared.get((profile, node)) or {})})
    return plans, missing


def plan_exclusion(profiles, resource_slices, nodes, device_class):
    """The GPU `exclusion.dra` runs on: the first (node, pool, GPU) of a complete pool that publishes an untainted
    whole-GPU device and an untainted claim-time device of one of `profiles` on that GPU; None when there is none.
    Returns {"profile": "whole", "vgpu_profile", "node", "hostname", "gpu", "whole", "device_class", "driver"}."""
    by_name = dict((n["metadata"]["name"], n) for n in nodes)
    for (node, _pool), entry in sorted(newest_pools(resource_slices).items()):
        if not entry["complete"]:
            continue
        usable = [d for d in sorted(entry["devices"], key=lambda d: str(d.get("name"))) if not d.get("taints")]
        wholes = dict((_attribute(d, "parentGPU"), d["name"]) for d in usable if _attribute(d, "wholeGPU") is True)
        for device in usable:
            gpu, profile = _attribute(device, "parentGPU"), _attribute(device, "profile")
            if claim_time(device) and gpu in wholes and profile in profiles:
                return {"profile": WHOLE, "vgpu_profile": profile, "node": node, "gpu": gpu, "whole": wholes[gpu],
                        "hostname": node_labels(by_name.get(node) or {}).get(HOSTNAME_LABEL, node),
                        "device_class": device_class, "driver": DRA_VGPU_DRIVER}
    return None


def exclusion_sides(plan):
    """The two plans whose claims exclude each other on the plan's GPU: the whole GPU, and a vGPU of it."""
    return dict(plan, profile=WHOLE), dict(plan, profile=plan["vgpu_profile"])


def exclusion_names():
    """(first, second) claim/VMI names of the two rounds: whole then vGPU, vGPU then whole."""
    return [("%s-excl-%d" % (VMI_PREFIX, n), "%s-excl-%d" % (VMI_PREFIX, n + 1)) for n in (1, 3)]


def exclusion_check(plan, rounds, window):
    """`rounds`: [(first plan, first name, its claim, second plan, second name, [(vmi, claim)] observed)], whole
    then vGPU and the other way round. PASS when each first claim holds its device on the GPU and each second
    one stayed unallocated, its VMI unscheduled, for the window."""
    subject = "%s@%s" % (plan["gpu"], plan["node"])
    details = {"node": plan["node"], "gpu": plan["gpu"], "vgpu_profile": plan["vgpu_profile"], "rounds": []}
    problems, unknown, said = [], [], []
    for first, a, held, second, b, seen in rounds:
        got = [r for r in allocated(held) if r[1] == plan["driver"]]
        given = [claim for _vmi, claim in seen if allocated(claim)]
        details["rounds"].append({"first": a, "holds": [_device(r) for r in got], "second": b,
                                  "phases": [_phase(vmi) for vmi, _claim in seen],
                                  "second_allocation": [_device(r) for r in allocated(given[-1])] if given else []})
        if not got:
            unknown.append("ResourceClaim %s (%s of GPU %s) was not allocated: nothing to exclude" % (
                a, first["profile"], plan["gpu"]))
            continue
        if given:
            problems.append("ResourceClaim %s (%s of GPU %s) was allocated %s while %s held %s: one GPU given whole and "
                            "as vGPUs" % (b, second["profile"], plan["gpu"], ", ".join(
                                _device(r) for r in allocated(given[-1])), a, ", ".join(_device(r) for r in got)))
            continue
        vmi = seen[-1][0] if seen else None
        if vmi is not None and (is_running(vmi) or node_of(vmi)):
            problems.append("VMI %s was placed on %s with its claim unallocated" % (b, node_of(vmi) or "a node"))
        elif vmi is None or unschedulable(vmi) is None:
            problems.append("ResourceClaim %s stayed unallocated but VMI %s has no Unschedulable condition after %gs"
                            % (b, b, window))
        else:
            said.append("%s (%s) stayed unallocated for %gs while %s held %s" % (
                b, second["profile"], window, a, ", ".join(_device(r) for r in got)))
    if problems:
        return Check(EXCLUSION, KAR_SHARING, subject, FAIL, "; ".join(problems), details)
    if unknown:
        return Check(EXCLUSION, KAR_SHARING, subject, UNKNOWN, "; ".join(unknown), details)
    return Check(EXCLUSION, KAR_SHARING, subject, PASS, "the whole GPU and %s vGPUs of it exclude each other: %s" % (
        plan["vgpu_profile"], "; ".join(said)), details)


def workload_names(plan):
    """The capacity VMIs (each with the claim of the same name) and the one-too-many VMI."""
    return vmi_names(plan, VMI_PREFIX)


# --- reading claims ----------------------------------------------------------------------------

def allocated(claim):
    """[(request, driver, pool, device)] of a claim's status.allocation; [] when unallocated."""
    status = (claim or {}).get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return [(r.get("request"), r.get("driver"), r.get("pool"), r.get("device")) for r in results]


def share_ids(claim):
    """{(pool, device): [shareID]} of a claim's allocation results that carry one (multi-allocatable devices)."""
    found = {}
    status = (claim or {}).get("status") or {}
    for result in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
        if result.get("shareID"):
            found.setdefault((result.get("pool"), result.get("device")), []).append(result["shareID"])
    return found


def reserved_for(claim):
    return ((claim or {}).get("status") or {}).get("reservedFor") or []


def _device(result):
    return "%s/%s" % (result[2], result[3])


def _phase(vmi):
    return ((vmi or {}).get("status") or {}).get("phase") or ("Pending" if vmi else "gone")


def _why_pending(vmi):
    cond = unschedulable(vmi)
    return ": " + " ".join(str(cond.get("message") or "Unschedulable").split()) if cond else ""


def sharing_check(plan, names, vmis, claims, timeout):
    """Every VMI Running on the plan's node, its claim allocated one published device of the profile there
    (each device once, a claim-time device up to its instances with a shareID per claim; reserved for its
    consumer), and two claims' devices on one physical GPU."""
    subject = "%s@%s" % (plan["profile"], plan["node"])
    got = dict((n, allocated(claims.get(n))) for n in names)
    details = {"node": plan["node"], "device_class": plan["device_class"], "vmis": list(names),
               "physical_gpus": plan["physical_gpus"], "gpus": plan["gpus"],
               "placement": dict((n, node_of(vmis.get(n))) for n in names),
               "allocation": dict((n, [_device(r) for r in got[n]]) for n in names)}
    problems = []
    late = [n for n in names if not is_running(vmis.get(n))]
    if late:
        problems.append("not Running after %gs: %s" % (timeout, "; ".join(
            "%s (%s%s)" % (n, _phase(vmis.get(n)), _why_pending(vmis.get(n))) for n in late)))
    elsewhere = [n for n in names if n not in late and node_of(vmis[n]) != plan["node"]]
    if elsewhere:
        problems.append("Running on another node than %s: %s" % (
            plan["node"], ", ".join("%s on %s" % (n, node_of(vmis[n])) for n in elsewhere)))
    holders, gpu_of, shares = {}, {}, {}
    claim_time_devices = plan.get("claim_time") or {}
    for name in names:
        mine = [r for r in got[name] if r[0] == "vgpu"]
        if name not in claims:
            problems.append("ResourceClaim %s is gone" % name)
            continue
        if len(mine) != 1:
            problems.append("ResourceClaim %s has %d allocated device(s) for its request, not 1" % (name, len(mine)))
            continue
        request, driver, pool, device = mine[0]
        if driver != plan["driver"] or (pool, device) not in plan["devices"]:
            problems.append("ResourceClaim %s got %s of driver %s, not a published %s device of %s" % (
                name, _device(mine[0]), driver, plan["profile"], plan["node"]))
            continue
        if not reserved_for(claims[name]):
            problems.append("ResourceClaim %s is allocated but reserved for no consumer" % name)
        if (pool, device) in claim_time_devices:
            share = share_ids(claims[name]).get((pool, device)) or []
            if len(share) != 1:
                problems.append("ResourceClaim %s got claim-time device %s/%s without a shareID" % (name, pool, device))
            shares.setdefault((pool, device), []).extend(share)
        holders.setdefault((pool, device), []).append(name)
        gpu_of[name] = plan["devices"][(pool, device)]
    for (pool, device), holding in sorted(holders.items()):
        allowed = claim_time_devices.get((pool, device), 1)
        if len(holding) > allowed:
            problems.append("device %s/%s allocated to %d claims (it serves %d): %s" % (
                pool, device, len(holding), allowed, ", ".join(holding)) if (pool, device) in claim_time_devices else
                "device %s/%s allocated to %d claims: %s" % (pool, device, len(holding), ", ".join(holding)))
        if len(set(shares.get((pool, device)) or ())) < len(shares.get((pool, device)) or ()):
            problems.append("claim-time device %s/%s: two claims got the same shareID" % (pool, device))
    details["parent_gpus"] = gpu_of
    if claim_time_devices:
        details["claim_time"] = sorted("%s/%s" % key for key in holders if key in claim_time_devices)
    if problems:
        return Check(SHARING, KAR_SHARING, subject, FAIL, "; ".join(problems), details)
    own = "device or instance (shareID) of a claim-time device, the profile chosen at allocation" \
        if claim_time_devices else "device"
    running = "%d VMI(s) with a ResourceClaim of DeviceClass %s (profile %s) Running on %s, each on its own %s" % (
        len(names), plan["device_class"], plan["profile"], plan["node"], own)
    by_gpu = {}
    for name in names:
        by_gpu.setdefault(gpu_of[name], []).append(name)
    shared = sorted((gpu, holding) for gpu, holding in by_gpu.items() if gpu and len(holding) > 1)
    if not shared:
        return Check(SHARING, KAR_SHARING, subject, UNKNOWN, running + ", every device on another physical GPU "
                     "(parentGPU): nothing shared to prove", details)
    gpu, holding = shared[0]
    return Check(SHARING, KAR_SHARING, subject, PASS, running + "; %s share physical GPU %s (status.allocation, "
                 "parentGPU)" % (" and ".join(holding[:2]) if len(holding) == 2 else ", ".join(holding), gpu), details)


def overallocation_check(plan, name, observed, capacity_claims, window):
    """The claim beyond the node's devices of the profile must stay unallocated and its VMI unscheduled.

    observed: [(vmi, claim)] seen during the window, last one last; capacity_claims: {name: claim} of the
    capacity VMIs then (to name a device given out twice)."""
    subject = "%s@%s" % (plan["profile"], plan["node"])
    number = "number %d for %d %s device(s)%s" % (
        plan["count"] + 1, plan["count"], plan["profile"], " and claim-time instance(s)" if plan.get("claim_time") else "")
    details = {"vmi": name, "claim": name, "capacity": plan["count"],
               "phases": [_phase(vmi) for vmi, _claim in observed]}
    holding = sorted(n for n, c in capacity_claims.items() if allocated(c))
    if len(holding) < plan["count"]:
        details["capacity_allocated"] = holding
        return Check(OVERALLOCATION, KAR_SHARING, subject, UNKNOWN, "only %d of the %d capacity claims were allocated: "
                     "the node's %s devices were not all taken, so claim %s proves nothing" % (
                         len(holding), plan["count"], plan["profile"], name), details)
    given = [claim for _vmi, claim in observed if allocated(claim)]
    if given:
        results = allocated(given[-1])
        holders = dict((_device(r), other) for other, claim in capacity_claims.items() for r in allocated(claim))
        twice = ["%s (also allocated to %s)" % (_device(r), holders[_device(r)]) for r in results if _device(r) in holders]
        details["allocation"] = [_device(r) for r in results]
        return Check(OVERALLOCATION, KAR_SHARING, subject, FAIL, "ResourceClaim %s (%s on %s) was allocated %s: "
                     "over-allocation not blocked" % (name, number, plan["node"], ", ".join(twice) or ", ".join(
                         details["allocation"])), details)
    placed = [vmi for vmi, _claim in observed if vmi and (is_running(vmi) or node_of(vmi))]
    if placed:
        return Check(OVERALLOCATION, KAR_SHARING, subject, FAIL, "VMI %s (%s) was placed on %s (%s) with its claim "
                     "unallocated" % (name, number, node_of(placed[-1]) or "a node", _phase(placed[-1])), details)
    vmi, claim = observed[-1] if observed else (None, None)
    if vmi is None or claim is None:
        return Check(OVERALLOCATION, KAR_SHARING, subject, FAIL, "VMI or ResourceClaim %s disappeared while observed"
                     % name, details)
    cond = unschedulable(vmi)
    if cond is None:
        return Check(OVERALLOCATION, KAR_SHARING, subject, FAIL, "ResourceClaim %s stayed unallocated but VMI %s has "
                     "no Unschedulable condition after %gs" % (name, name, window), details)
    details["condition"] = cond
    return Check(OVERALLOCATION, KAR_SHARING, subject, PASS, "ResourceClaim %s (%s on %s) stayed unallocated and "
                 "VMI %s %s for %gs: %s" % (name, number, plan["node"], name, _phase(vmi), window, " ".join(
                     str(cond.get("message") or "Unschedulable").split())), details)
