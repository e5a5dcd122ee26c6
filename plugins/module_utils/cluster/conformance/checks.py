# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The conformance checks of KAR-0003 / KAR-0004 as pure functions: cluster objects in, rows out.

Every function takes plain dicts (the KubeVirt CR, Nodes, VMIs as the API returned them, the nodes'
vGPU facts) and returns `Check` rows or plain data; the I/O that creates and watches workloads lives
in run.py. A row is PASS, FAIL or UNKNOWN with one line saying why. UNKNOWN is for what the run
cannot decide (an accelerator the catalog does not know, a fact it has no source for), never a
softened FAIL, and never turned into a PASS.

A permitted NVIDIA PCI entry that no vGPU profile maps to (no profile in its resource name, no node's
profile labels or facts publish it, and a name outside the vGPU naming `nvidia.com/NVIDIA_*` /
`nvidia.com/GRID_*`) is a whole GPU passed through, e.g. `nvidia.com/GB202GL_RTX_PRO_6000`: it gets
one inventory row, UNKNOWN ("passthrough, not attested"), and no other check counts it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, shown
from ansible_collections.accelops.vgpu.plugins.module_utils.gpu_models import NVIDIA_MODELS, model_name
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.kubevirt import MDEV, PCI, SELECTOR, model_resource_name
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import resource_name, short_name

PASS, FAIL, UNKNOWN = "PASS", "FAIL", "UNKNOWN"
KAR_SHARING, KAR_VIRTUALIZED = "KAR-0003", "KAR-0004"
DEFAULT_PROFILE_PREFIX = "accelops.io/vgpu.profile."
HOSTNAME_LABEL = "kubernetes.io/hostname"
_EXTENDED_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_PROFILE_RE = re.compile(r"^[A-Za-z0-9]+(-\d+)?-\d+[A-Z]+\Z")
VGPU_RESOURCE_PREFIXES = ("nvidia.com/NVIDIA_", "nvidia.com/GRID_")  # kubevirt.resource_name / model naming


class ConformanceError(EngineError):
    """A run that cannot start or go on (bad input, missing cluster piece); one line naming the object."""


@dataclass
class Check:
    """One report row."""

    check: str          # inventory, accounting, sharing, over-allocation, health.ready, health.guest, consistency...
    requirement: str    # KAR-0003 / KAR-0004
    subject: str        # what the row is about: a resource, node/resource, profile@node
    status: str
    reason: str
    details: dict = field(default_factory=dict)

    def as_dict(self):
        return {"check": self.check, "requirement": self.requirement, "subject": self.subject,
                "status": self.status, "reason": self.reason, "details": self.details}


@dataclass
class Resource:
    """A vGPU resource the KubeVirt CR permits, and where it shows up."""

    name: str
    kind: str                   # pciHostDevices / mediatedDevices
    selector: str | None        # pciVendorSelector / mdevNameSelector
    external: bool
    model: str | None           # catalog model name, None = unknown accelerator
    allocatable: dict = field(default_factory=dict)    # node -> int (nodes advertising it)
    labelled: dict = field(default_factory=dict)       # node -> {profile: count} from the profile labels
    profiles: set = field(default_factory=set)         # profiles that map to this resource
    named: set = field(default_factory=set)            # the profile its own name or mdev type names

    @property
    def passthrough(self):
        """A whole GPU passed through, not one of our vGPU resources (module docstring)."""
        return self.kind == PCI and not self.profiles and not self.name.startswith(VGPU_RESOURCE_PREFIXES)


# --- names -----------------------------------------------------------------------------------

def profile_resources(profile):
    """The resource names a profile is published under: per profile (default naming) or per model.
    Drivers name types `NVIDIA <profile>`, older ones (T4, mdev) `GRID <profile>`."""
    return set(name for vendor in ("NVIDIA ", "GRID ")
               for name in (resource_name(vendor + profile), model_resource_name(vendor + profile)))


def publishes(res, profile):
    """Whether vGPUs of `profile` show up as resource `res` (by its name, or its mdev type's short name)."""
    return profile in res.named or res.name in profile_resources(profile)


def _profile_from_resource(name):
    """`nvidia.com/NVIDIA_L40S-24Q` -> `L40S-24Q` (profile naming); None for model names."""
    prefix = "nvidia.com/NVIDIA_"
    if name.startswith(prefix) and _PROFILE_RE.match(name[len(prefix):]):
        return name[len(prefix):]
    return None


def _type_model(type_name):
    """`NVIDIA A16-4Q` -> the catalog model (`A2/A16`) whose name carries the type's model, or None."""
    token = short_name(type_name).split("-")[0].upper()
    for model in sorted(set(NVIDIA_MODELS.values())):
        if token in [alt.split()[0].upper() for alt in model.split("/")]:
            return model
    return None


def catalog_model(kind, selector):
    """The catalog model of a permitted entry: by PCI ID (pci) or by mdev type name; None when unknown."""
    if not selector:
        return None
    if kind == PCI:
        vendor, _sep, device = selector.partition(":")
        return model_name(vendor, device)
    return _type_model(selector)


def _is_nvidia(kind, entry):
    name = str(entry.get("resourceName") or "")
    selector = str(entry.get(SELECTOR[kind]) or "")
    if kind == PCI:
        return selector.upper().startswith("10DE:") or name.startswith("nvidia.com/")
    return name.startswith("nvidia.com/") or selector.upper().startswith(("NVIDIA ", "GRID "))


def _int(value):
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def node_name(node):
    return node["metadata"]["name"]


def node_labels(node):
    return (node.get("metadata") or {}).get("labels") or {}


def label_profiles(node, prefix=DEFAULT_PROFILE_PREFIX):
    """{profile: count} from the node's profile labels."""
    return dict((key[len(prefix):], _int(value)) for key, value in node_labels(node).items()
                if key.startswith(prefix) and key != prefix)


# --- the node's own view (vgpu_profile results or vgpu_facts) -----------------------------------

def facts_profiles(facts):
    """{profile: {"count": vGPUs, "gpus": [physical GPU addresses]}} from one node's facts.

    Two shapes are read: the `gpus` result of vgpu_profile (role fact `vgpu_profiles_gpus`: per GPU,
    its `vgpus[].after`) and vgpu_facts' `vgpu` fact (`vfs[].vgpu_type` with `pf`, `mdevs[].type_name`
    with `parent`). A VF's vGPU sits on its PF: that PF is the physical GPU two VMs share.
    """
    found = {}

    def add(profile, gpu):
        entry = found.setdefault(profile, {"count": 0, "gpus": []})
        entry["count"] += 1
        if gpu not in entry["gpus"]:
            entry["gpus"].append(gpu)

    if not isinstance(facts, dict):
        return found
    if "vfs" in facts or "mdevs" in facts:
        pf_of = dict((vf.get("address"), vf.get("pf")) for vf in facts.get("vfs") or [])
        for vf in facts.get("vfs") or []:
            if vf.get("vgpu_type"):
                add(short_name(vf["vgpu_type"]), vf.get("pf"))
        for mdev in facts.get("mdevs") or []:
            if mdev.get("type_name"):
                add(short_name(mdev["type_name"]), pf_of.get(mdev.get("parent"), mdev.get("parent")))
        return found
    for gpu in facts.get("gpus") or []:
        for vgpu in gpu.get("vgpus") or []:
            if vgpu.get("after"):
                add(short_name(vgpu["after"]), gpu.get("address"))
    return found


# --- inventory ---------------------------------------------------------------------------------

def discover_resources(kubevirt_cr, nodes, prefix=DEFAULT_PROFILE_PREFIX):
    """The NVIDIA entries of permittedHostDevices as Resources, mapped to nodes (allocatable, labels)."""
    permitted = ((kubevirt_cr.get("spec") or {}).get("configuration") or {}).get("permittedHostDevices") or {}
    resources = []
    for kind in (PCI, MDEV):
        for entry in permitted.get(kind) or []:
            if not isinstance(entry, dict) or not entry.get("resourceName") or not _is_nvidia(kind, entry):
                continue
            selector = entry.get(SELECTOR[kind])
            res = Resource(entry["resourceName"], kind, selector, bool(entry.get("externalResourceProvider")),
                           catalog_model(kind, selector))
            named = (short_name(selector) if kind == MDEV and selector else None) or _profile_from_resource(res.name)
            if named:
                res.named.add(named)
                res.profiles.add(named)
            for node in nodes:
                count = _int(((node.get("status") or {}).get("allocatable") or {}).get(res.name))
                if count > 0:
                    res.allocatable[node_name(node)] = count
                mine = dict((p, c) for p, c in label_profiles(node, prefix).items() if publishes(res, p))
                if mine:
                    res.labelled[node_name(node)] = mine
                    res.profiles.update(mine)
            resources.append(res)
    return resources


def vgpu_resources(resources):
    """The resources that are vGPUs (passthrough entries left out)."""
    return [res for res in resources if not res.passthrough]


def select_profiles(resources, wanted, also=()):
    """The profiles to test: all (wanted empty) or `wanted`, each of which must be known (from the resources,
    or `also`: the profiles a DRA driver publishes)."""
    known = sorted(set(p for res in resources for p in res.profiles) | set(also))
    for profile in wanted or []:
        if profile not in known:
            raise ConformanceError("profile %s: not a vGPU profile of this cluster (known: %s)"
                                   % (shown(profile), ", ".join(known) or "none"))
    return list(wanted) if wanted else known


def inventory_checks(resources):
    rows = []
    for res in resources:
        selector = "%s %s" % (SELECTOR[res.kind], res.selector) if res.selector else "no selector"
        details = {"kind": res.kind, "selector": res.selector, "model": res.model, "nodes": dict(res.allocatable),
                   "profiles": sorted(res.profiles), "external_resource_provider": res.external}
        details["passthrough"] = res.passthrough
        if res.passthrough:
            where = ", ".join("%s: %d" % item for item in sorted(res.allocatable.items())) or "no node advertises it"
            status, reason = UNKNOWN, ("%s%s is permitted for passthrough of a whole GPU (%s): no vGPU profile maps "
                                       "to it, so it is not a vGPU resource of this collection; not attested"
                                       % (selector, " (%s)" % res.model if res.model else "", where))
        elif res.model is None:
            status, reason = UNKNOWN, ("%s is not in the collection's GPU catalog: unknown accelerator, verify by hand"
                                       % selector)
        elif not res.allocatable:
            status, reason = FAIL, "%s (%s) is permitted but no node advertises it in status.allocatable" % (
                selector, res.model)
        else:
            where = ", ".join("%s: %d" % item for item in sorted(res.allocatable.items()))
            status, reason = PASS, "%s (%s) on %d node(s) (%s)" % (selector, res.model, len(res.allocatable), where)
        rows.append(Check("inventory", KAR_SHARING, res.name, status, reason, details))
    return rows


# --- accounting --------------------------------------------------------------------------------

def accounting_checks(resources, node_facts, dra_served=None):
    """allocatable[resource] == the node's vGPUs of the profiles published under it.

    The node's facts (when the inventory has the node) are the truth; the profile labels are the
    fallback and are compared with the facts when both exist. `dra_served` ({node: {profile: count}},
    dra.dra_vgpus): the vGPUs this collection's DRA driver publishes. An agent that serves some GPUs through
    its device plugin and the others through DRA (DEVICE_PLUGIN_GPUS, DRA_DRIVER_GPUS) leaves those out of the
    extended resource: a node whose allocatable is its count less the DRA driver's vGPUs passes too.
    """
    rows = []
    for res in vgpu_resources(resources):
        nodes = set(res.allocatable) | set(res.labelled)
        for name, facts in node_facts.items():
            if any(publishes(res, p) for p in facts_profiles(facts)):
                nodes.add(name)
        for name in sorted(nodes):
            alloc = res.allocatable.get(name, 0)
            labelled = res.labelled.get(name)
            by_label = sum(labelled.values()) if labelled else None
            facts = node_facts.get(name)
            by_facts = None
            if facts is not None:
                by_facts = sum(v["count"] for p, v in facts_profiles(facts).items() if publishes(res, p))
            dra_count = sum(n for p, n in ((dra_served or {}).get(name) or {}).items() if publishes(res, p))
            if dra_count and alloc not in (by_facts, by_label) and alloc + dra_count in (by_facts, by_label):
                # a split node: the DRA driver's vGPUs are not the extended resource's
                by_label, by_facts = [None if n is None else n - dra_count for n in (by_label, by_facts)]
            else:
                dra_count = 0
            details = {"node": name, "allocatable": alloc, "labels": labelled, "facts": by_facts}
            if dra_count:
                details["dra"] = dra_count
            subject = "%s %s" % (name, res.name)
            if by_facts is not None:
                status = PASS if alloc == by_facts and by_label in (None, by_facts) else FAIL
                reason = "allocatable %d, node facts %d vGPU(s)" % (alloc, by_facts)
                if by_label is not None:
                    reason += ", profile labels %d" % by_label
                if by_label not in (None, by_facts):
                    reason += " (labels stale)"
            elif by_label is not None:
                status = PASS if alloc == by_label else FAIL
                reason = "allocatable %d, profile labels %s" % (alloc, ", ".join(
                    "%s=%d" % item for item in sorted(labelled.items())))
            else:
                status = UNKNOWN
                reason = ("allocatable %d, but neither a profile label nor node facts say how many vGPUs the node "
                          "has (label the node, or add it to the inventory)" % alloc)
            if dra_count:
                reason += " (%d more through the DRA driver)" % dra_count
            rows.append(Check("accounting", KAR_SHARING, subject, status, reason, details))
    return rows


# --- workloads ---------------------------------------------------------------------------------

def plan_workloads(resources, profiles, node_facts, nodes, dra_gpus=None):
    """One workload per profile: the node with the most vGPUs of it, as many VMIs as it has.

    Returns [{"profile", "resource", "node", "hostname", "count", "physical_gpus"}] (physical_gpus:
    how many of the node's GPUs carry the profile, None without node facts) and the profiles no
    node offers (a row of their own). `dra_gpus` ({node: {GPU}}, dra.dra_gpus): GPUs whose vGPUs the DRA
    driver publishes; on a node whose resource offers fewer vGPUs than it has (split between the agent's device
    plugin and DRA), they carry none of it.
    """
    by_name = dict((node_name(n), n) for n in nodes)
    plans, missing = [], []
    for profile in profiles:
        candidates = []
        for res in resources:
            if profile not in res.profiles:
                continue
            for name, alloc in res.allocatable.items():
                labelled = res.labelled.get(name)
                if labelled is not None and profile not in labelled:
                    continue   # model naming: the node carries another profile of the model
                candidates.append((-alloc, name, res))
        if not candidates:
            missing.append(profile)
            continue
        minus_alloc, name, res = sorted(candidates, key=lambda c: (c[0], c[1]))[0]
        facts = facts_profiles(node_facts[name]).get(profile) if name in node_facts else None
        gpus = list(facts["gpus"]) if facts else None
        if gpus and -minus_alloc < facts["count"]:   # a split node: the GPUs the DRA driver publishes are its own
            gpus = [g for g in gpus if g not in (dra_gpus or {}).get(name, ())] or gpus
        plans.append({"profile": profile, "resource": res.name, "node": name,
                      "hostname": node_labels(by_name[name]).get(HOSTNAME_LABEL, name), "count": -minus_alloc,
                      "physical_gpus": len(gpus) if gpus is not None else None, "gpus": gpus})
    return plans, missing


def dns_label(text):
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


def vmi_names(plan, prefix="vgpu-conformance"):
    """The capacity VMIs and the one-too-many VMI of a workload, DNS-1123 names."""
    base = ("%s-%s" % (prefix, dns_label(plan["profile"])))[:52].rstrip("-")
    return ["%s-%d" % (base, i + 1) for i in range(plan["count"])], base + "-extra"


def _phase(vmi):
    return ((vmi or {}).get("status") or {}).get("phase") or "Pending"


def node_of(vmi):
    return ((vmi or {}).get("status") or {}).get("nodeName")


def condition(vmi, kind):
    for cond in ((vmi or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def is_running(vmi):
    return _phase(vmi) == "Running"


def is_ready(vmi):
    cond = condition(vmi, "Ready")
    return bool(cond) and str(cond.get("status")) == "True"


def unschedulable(vmi):
    """The Unschedulable condition (KubeVirt mirrors the launcher pod's PodScheduled=False), or None."""
    for cond in ((vmi or {}).get("status") or {}).get("conditions") or []:
        if cond.get("reason") == "Unschedulable" and str(cond.get("status")) == "False":
            return cond
    return None


def _names(items):
    return ", ".join(items)


def sharing_check(plan, names, vmis, timeout):
    """All capacity VMIs Running on the plan's node, and at least two on one physical GPU.

    Per-VMI device mapping (which VF/mdev a VMI got) is not read: KubeVirt does not publish it in the
    VMI. The proof is the pigeonhole: more VMIs Running on the node than physical GPUs carrying the
    profile there (from the node's facts) means two share one GPU. Without facts: UNKNOWN.
    """
    subject = "%s@%s" % (plan["profile"], plan["node"])
    details = {"node": plan["node"], "resource": plan["resource"], "vmis": list(names),
               "physical_gpus": plan["physical_gpus"], "gpus": plan.get("gpus"),
               "placement": dict((n, node_of(vmis.get(n))) for n in names)}
    not_running = [n for n in names if not is_running(vmis.get(n))]
    elsewhere = [n for n in names if is_running(vmis.get(n)) and node_of(vmis.get(n)) != plan["node"]]
    if not_running:
        phases = ", ".join("%s (%s)" % (n, _phase(vmis.get(n)) if vmis.get(n) else "gone") for n in not_running)
        return Check("sharing", KAR_SHARING, subject, FAIL, "not Running after %gs: %s" % (timeout, phases), details)
    if elsewhere:
        return Check("sharing", KAR_SHARING, subject, FAIL, "Running on another node than %s: %s"
                     % (plan["node"], ", ".join("%s on %s" % (n, node_of(vmis[n])) for n in elsewhere)), details)
    running = "%d VMI(s) requesting %s Running on %s" % (len(names), plan["resource"], plan["node"])
    gpus = plan["physical_gpus"]
    if gpus is None:
        return Check("sharing", KAR_SHARING, subject, UNKNOWN, running + "; which physical GPU each uses is unknown: "
                     "no node facts for %s (add the node to the inventory)" % plan["node"], details)
    if len(names) <= gpus:
        return Check("sharing", KAR_SHARING, subject, UNKNOWN, running + " on %d physical GPU(s): this profile gives "
                     "no more vGPUs than GPUs on the node, nothing shared to prove" % gpus, details)
    return Check("sharing", KAR_SHARING, subject, PASS, running + " on %d physical GPU(s) carrying %s: at least two "
                 "share one GPU (pigeonhole; per-VMI device mapping is not published by KubeVirt)"
                 % (gpus, plan["profile"]), details)


def overallocation_check(plan, name, observed, window, capacity_vmis):
    """The VMI beyond capacity must never run and must carry an Unschedulable condition.

    observed: the VMI objects seen during the observation window (last one last); capacity_vmis: {name: VMI}
    of the capacity VMIs after the window. Only while they all run on the node are its vGPUs all taken: else a
    pending extra VMI proves nothing (UNKNOWN) and a placed one may have got a free vGPU.
    """
    subject = "%s@%s" % (plan["profile"], plan["node"])
    last = observed[-1] if observed else None
    details = {"vmi": name, "capacity": plan["count"], "phases": [_phase(v) for v in observed if v]}
    taking = sorted(n for n, v in capacity_vmis.items() if is_running(v) and node_of(v) == plan["node"])
    if len(taking) < plan["count"]:
        details["capacity_running"] = taking
        return Check("over-allocation", KAR_SHARING, subject, UNKNOWN, "only %d of the %d capacity VMI(s) Running on "
                     "%s: its %s vGPUs were not all taken, so VMI %s proves nothing" % (
                         len(taking), plan["count"], plan["node"], plan["profile"], name), details)
    ran = [v for v in observed if v and (is_running(v) or _phase(v) == "Scheduled" or node_of(v))]
    if ran:
        return Check("over-allocation", KAR_SHARING, subject, FAIL, "VMI %s (number %d on %d vGPU(s)) was placed on %s "
                     "(%s): over-allocation not blocked" % (name, plan["count"] + 1, plan["count"],
                                                            node_of(ran[-1]) or "a node", _phase(ran[-1])), details)
    if last is None:
        return Check("over-allocation", KAR_SHARING, subject, FAIL, "VMI %s disappeared while observed" % name, details)
    cond = unschedulable(last)
    if cond is None:
        return Check("over-allocation", KAR_SHARING, subject, FAIL, "VMI %s stayed %s for %gs but has no Unschedulable "
                     "condition" % (name, _phase(last), window), details)
    details["condition"] = cond
    return Check("over-allocation", KAR_SHARING, subject, PASS, "VMI %s (number %d) stayed %s for %gs: %s" % (
        name, plan["count"] + 1, _phase(last), window, " ".join(str(cond.get("message") or "Unschedulable").split())),
        details)


def ready_check(plan, names, vmis, timeout):
    subject = "%s@%s" % (plan["profile"], plan["node"])
    late = [n for n in names if not is_ready(vmis.get(n))]
    details = {"vmis": list(names), "not_ready": late}
    if late:
        return Check("health.ready", KAR_VIRTUALIZED, subject, FAIL, "not Ready after %gs: %s" % (timeout, _names(late)),
                     details)
    return Check("health.ready", KAR_VIRTUALIZED, subject, PASS, "all %d VMI(s) Ready" % len(names), details)


def guest_check(plan, command, results):
    """results: {vmi: (rc, one-line output)}, None when no guest command is configured."""
    subject = "%s@%s" % (plan["profile"], plan["node"])
    if not command:
        return Check("health.guest", KAR_VIRTUALIZED, subject, UNKNOWN, "no guest command configured: the accelerator "
                     "inside the guest was not exercised (set guest_command, e.g. nvidia-smi)", {})
    details = {"command": command, "results": dict((n, {"rc": rc, "output": out}) for n, (rc, out) in results.items())}
    bad = ["%s (rc %s: %s)" % (n, rc, out) for n, (rc, out) in sorted(results.items()) if rc != 0]
    if bad or not results:
        return Check("health.guest", KAR_VIRTUALIZED, subject, FAIL, "%r failed in: %s" % (
            command, "; ".join(bad) or "no Ready VMI to run it in"), details)
    return Check("health.guest", KAR_VIRTUALIZED, subject, PASS, "%r exited 0 in all %d VMI(s)" % (command, len(results)),
                 details)


def not_run_rows(plan_or_profile, why):
    """The workload rows of a profile that was not exercised (check mode, no node offers it)."""
    if isinstance(plan_or_profile, dict):
        subject = "%s@%s" % (plan_or_profile["profile"], plan_or_profile["node"])
    else:
        subject = plan_or_profile
    return [Check(check, req, subject, UNKNOWN, why) for check, req in (
        ("sharing", KAR_SHARING), ("over-allocation", KAR_SHARING), ("health.ready", KAR_VIRTUALIZED),
        ("health.guest", KAR_VIRTUALIZED))]


# --- consistency with physical fractional GPUs --------------------------------------------------

def consistency_checks(resources, nodes, prefix=DEFAULT_PROFILE_PREFIX):
    """Naming, request form and labels of each vGPU resource next to MIG and time-sliced GPUs.

    PASS when the resource is what a container workload on a fractional GPU would see: a vendor-prefixed
    extended resource with an integer count per node, requested by name, and nodes labelled so a
    workload can select the profile (the GPU Operator labels MIG/time-sliced nodes likewise).
    """
    by_name = dict((node_name(n), n) for n in nodes)
    rows = []
    for res in vgpu_resources(resources):
        side = {
            "vgpu": {"resource": res.name, "request": "spec.domain.devices.gpus[].deviceName: %s" % res.name,
                     "launcher_pod": "resources.limits[%s]: 1 (virt-launcher pod, set by KubeVirt)" % res.name,
                     "labels": "%s<profile>=<count>" % prefix},
            "mig": {"resource": "nvidia.com/mig-<G>g.<GB>gb (mixed strategy) or nvidia.com/gpu (single)",
                    "request": "resources.limits[nvidia.com/mig-1g.10gb]: 1",
                    "labels": "nvidia.com/mig.config, nvidia.com/gpu.product"},
            "time_sliced": {"resource": "nvidia.com/gpu (replicas per GPU)", "request": "resources.limits[nvidia.com/gpu]: 1",
                            "labels": "nvidia.com/gpu.replicas, nvidia.com/gpu.product (-SHARED)"},
        }
        problems = []
        if not _EXTENDED_RESOURCE_RE.match(res.name) or not res.name.startswith("nvidia.com/"):
            problems.append("%s is not a vendor-prefixed extended resource name (nvidia.com/...)" % res.name)
        unlabelled = sorted(n for n in res.allocatable if n not in res.labelled)
        if unlabelled:
            problems.append("node(s) %s advertise it without a %s<profile> label" % (", ".join(unlabelled), prefix))
        for name in sorted(res.allocatable):
            raw = ((by_name[name].get("status") or {}).get("allocatable") or {}).get(res.name)
            if not re.match(r"^\d+\Z", str(raw)):
                problems.append("node %s allocatable %r is not an integer count" % (name, raw))
        if problems:
            rows.append(Check("consistency", KAR_VIRTUALIZED, res.name, FAIL, "; ".join(problems), side))
        elif not res.allocatable:
            rows.append(Check("consistency", KAR_VIRTUALIZED, res.name, UNKNOWN, "no node advertises it", side))
        else:
            rows.append(Check("consistency", KAR_VIRTUALIZED, res.name, PASS, "integer extended resource %s requested "
                              "by name (VMI devices.gpus[].deviceName -> launcher pod resources.limits), nodes "
                              "labelled per profile: the form MIG (nvidia.com/mig-*) and time-sliced (nvidia.com/gpu) "
                              "GPUs use" % res.name, side))
    return rows


def summary(rows):
    counts = {PASS: 0, FAIL: 0, UNKNOWN: 0}
    for row in rows:
        counts[row.status] += 1
    return {"pass": counts[PASS], "fail": counts[FAIL], "unknown": counts[UNKNOWN], "total": len(rows)}
