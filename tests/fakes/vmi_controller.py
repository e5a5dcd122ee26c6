"""A small fake KubeVirt controller + scheduler for the conformance tests and the demo.

    python tests/fakes/vmi_controller.py --api http://127.0.0.1:PORT [--never-ready NAME] [--no-block]

It talks HTTP to the Kubernetes API server double (tests/fakes/kmock_serve.py) like a controller
would, polling every --interval seconds:
- a new VMI becomes Pending; a Pending VMI is placed on the first node (by name) that matches its
  nodeSelector and still has `status.allocatable` room for every resource its
  `spec.domain.devices.gpus[]/hostDevices[].deviceName` request (counting the VMIs already placed);
  without room it stays Pending with the condition KubeVirt mirrors from an unschedulable launcher
  pod (PodScheduled=False, reason Unschedulable, "0/N nodes are available: ... Insufficient <res>");
- a VMI with `spec.resourceClaims` (DRA, KubeVirt's GPUsWithDRA) is placed only where every claim can
  be allocated, as kube-scheduler's DynamicResources plugin does (see `DraAllocator`); the claims get
  `status.allocation` + `status.reservedFor` and the delete-protection finalizer; without a fitting node
  the VMI stays Pending with "... cannot allocate all claims" and its claims stay unallocated;
- a placed VMI goes Scheduling -> Scheduled -> Running -> Ready (one step per poll);
- `never_ready` VMIs reach Running but never Ready (a broken guest);
- `block_overallocation=False` is a broken scheduler: a VMI without room is placed anyway, and a claim
  without a free device gets one already allocated to another claim.
- a VMI's `resourceClaimTemplateName` entry gets its own ResourceClaim, made from the ResourceClaimTemplate as
  the resourceclaim controller makes it for the launcher pod (`template_claim`), then allocated like any claim.
It creates nothing but those claims and deletes nothing: otherwise it only PATCHes the status of VMIs and
ResourceClaims it sees (and, as the resourceclaim controller, releases the claims of VMIs that are gone; the API
double's garbage collector deletes a template's claim with its VMI, the owner's UID being the VMI's).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections import Counter

try:
    from ansible_collections.accelops.vgpu.tests.fakes import dra_cel
except ImportError:   # run as a script (tools/demo.py): this directory is on sys.path
    import dra_cel  # type: ignore[no-redef]

VMIS = "/apis/kubevirt.io/v1/virtualmachineinstances"
NODES = "/api/v1/nodes"
NEXT = {"Scheduling": "Scheduled", "Scheduled": "Running"}
DRA = "/apis/resource.k8s.io/v1/"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"   # k8s.io/api resource/v1 Finalizer
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"         # the resourceclaim controller's annotation
CANNOT_ALLOCATE = "cannot allocate all claims"                   # the DynamicResources plugin's Filter reason


class Unallocatable(Exception):
    """Why the claims of a VMI cannot be allocated on a node (one line)."""


def consumer(vmi):
    """The claims' consumer: KubeVirt's virt-launcher pod. The fake runs no pods, so the VMI stands for it
    (pod `virt-launcher-<vmi>`, the VMI's UID)."""
    meta = vmi["metadata"]
    return {"resource": "pods", "name": "virt-launcher-" + meta["name"], "uid": meta.get("uid")}


class DraAllocator:
    """kube-scheduler's DRA allocation (k8s.io/dynamic-resource-allocation structured allocator) for one pass.

    Sources (kubernetes v1.36.2): staging/src/k8s.io/dynamic-resource-allocation/structured/allocator.go and
    internal/incubating/allocator_incubating.go (allocateDevice, checkAvailableCounters, IsDeviceAllocated),
    internal/incubating/consumable_capacity.go (request policies), pkg/scheduler/framework/plugins/
    dynamicresources (Filter: "cannot allocate all claims").
    Devices come from the ResourceSlices of each pool's highest generation, and only from complete pools
    (resourceSliceCount slices there), on the node (`spec.nodeName`) or on all nodes (`spec.allNodes`).
    A request (`exactly`: deviceClassName, selectors, allocationMode ExactCount/All, count, capacity.requests)
    gets devices that every selector of its DeviceClass and of the request selects (CEL, tests/fakes/dra_cel.py;
    an evaluation error fails the allocation). `firstAvailable` tries its subrequests in order and the result
    names `<request>/<subrequest>`. Partitionable devices (KEP-4815): the pool's `sharedCounters` (from its
    counter slices) are what its devices' `consumesCounters` draw on; a device draws while it is allocated at
    all, once, however many claims share it (IsDeviceAllocated over AllocatedDevices, AllocatedSharedDeviceIDs
    and AggregatedCapacity: kubernetes #139040, in 1.36.2), and only while the slices still publish it: an
    allocated device withdrawn from the slices charges nothing (checkAvailableCounters looks the allocated devices
    up in the slices; kubernetes#140806, open). Device taints (KEP-5055): a device with a NoSchedule or NoExecute
    taint that no toleration of the request tolerates is not allocated to a new claim; claims allocated already
    keep it (and it keeps charging its counters). Consumable capacity (KEP-5075): a device with
    `allowMultipleAllocations` serves several claims; each allocation consumes, per capacity, the request's
    amount (or the policy's default; rounded up to the next of `validValues`, none -> unfit; no policy: the
    request's amount, else the whole capacity), and the sum stays within the capacity; its result carries
    `shareID` and `consumedCapacity`. Other devices go to one claim. Greedy first fit per request, no
    backtracking across requests (the real allocator backtracks; no test here depends on it). Constraints
    (`spec.devices.constraints`: matchAttribute, distinctAttribute) and admin access (`adminAccess` on a request
    or subrequest) are not modelled: such a claim is refused (Unallocatable naming the claim and what is not
    modelled, which the VMI's PodScheduled condition shows), never allocated as if they were absent. (A
    template's claim is created before it gets here: VmiController._pod_claims.)
    """

    def __init__(self, classes, slices, claims, overallocate=False):
        self.classes = dict((c["metadata"]["name"], c) for c in classes)
        self.claims = claims
        self.overallocate = overallocate
        newest = {}
        for item in slices:
            spec = item.get("spec") or {}
            pool = spec.get("pool") or {}
            key = (spec.get("driver"), pool.get("name"))
            newest.setdefault(key, []).append(item)
        self.pools = {}
        for key, items in newest.items():
            top = max(int(i["spec"]["pool"].get("generation") or 0) for i in items)
            current = [i for i in items if int(i["spec"]["pool"].get("generation") or 0) == top]
            if len(current) >= int(current[0]["spec"]["pool"].get("resourceSliceCount") or 1):
                self.pools[key] = current
        self.entries = {}       # (driver, pool, device) -> the device's slice entry
        self.counter_sets = {}  # (driver, pool) -> {counter set: {counter: total}}
        for (driver, pool), items in self.pools.items():
            sets = self.counter_sets.setdefault((driver, pool), {})
            for item in items:
                for device in item["spec"].get("devices") or ():
                    self.entries[(driver, pool, device["name"])] = device
                for counter_set in item["spec"].get("sharedCounters") or ():
                    sets[counter_set["name"]] = {name: quantity(value.get("value"))
                                                 for name, value in (counter_set.get("counters") or {}).items()}
        self.taken = set()      # devices one claim has
        self.shares = {}        # multi-allocatable device -> {capacity: consumed}
        for claim in claims.values():
            for result in allocation_results(claim):
                self._add(result)

    def snapshot(self):
        return set(self.taken), {key: dict(used) for key, used in self.shares.items()}

    def restore(self, saved):
        self.taken, self.shares = set(saved[0]), {key: dict(used) for key, used in saved[1].items()}

    def _add(self, result):
        key = (result.get("driver"), result.get("pool"), result.get("device"))
        if result.get("shareID") or (self.entries.get(key) or {}).get("allowMultipleAllocations"):
            used = self.shares.setdefault(key, {})
            for name, value in (result.get("consumedCapacity") or {}).items():
                used[name] = used.get(name, 0) + quantity(value)
        else:
            self.taken.add(key)

    def in_use(self, key):
        return key in self.taken or key in self.shares

    def devices_on(self, node):
        """[(driver, pool, device entry)] the node can use, in a stable order."""
        found = []
        for (driver, pool), items in sorted(self.pools.items()):
            for item in items:
                spec = item["spec"]
                if spec.get("nodeName") == node or spec.get("allNodes"):
                    found += [(driver, pool, device) for device in spec.get("devices") or ()]
        return found

    def _selected(self, selectors, driver, device, where):
        for index, selector in enumerate(selectors or ()):
            expression = (selector.get("cel") or {}).get("expression")
            if expression is None:
                raise Unallocatable("%s: selector #%d has no CEL expression" % (where, index))
            try:
                if not dra_cel.matches(expression, driver, device):
                    return False
            except dra_cel.CelError as exc:
                raise Unallocatable("%s: selector #%d: CEL runtime error: %s" % (where, index, exc)) from None
        return True

    def _counters_fit(self, key, device):
        """Whether `device`, not in use yet, may draw its consumesCounters from its pool now (checkAvailableCounters)."""
        if not device.get("consumesCounters"):
            return True
        sets = self.counter_sets.get(key[:2]) or {}
        drawn = {}
        for other in set(self.taken) | set(self.shares):
            if other[:2] != key[:2]:
                continue
            for entry in (self.entries.get(other) or {}).get("consumesCounters") or ():
                for name, value in (entry.get("counters") or {}).items():
                    drawn[entry["counterSet"], name] = drawn.get((entry["counterSet"], name), 0) + quantity(value["value"])
        for entry in device["consumesCounters"]:
            for name, value in (entry.get("counters") or {}).items():
                total = (sets.get(entry["counterSet"]) or {}).get(name)
                if total is None or drawn.get((entry["counterSet"], name), 0) + quantity(value["value"]) > total:
                    return False
        return True

    def _consumption(self, key, device, spec):
        """{capacity: amount} one more allocation of the multi-allocatable `device` consumes, or None (no fit)."""
        asked = ((spec.get("capacity") or {}).get("requests")) or {}
        used = self.shares.get(key) or {}
        consumed = {}
        for name, capacity in (device.get("capacity") or {}).items():
            total, policy = quantity(capacity.get("value")), capacity.get("requestPolicy")
            if policy is None:
                amount = quantity(asked[name]) if name in asked else total
            else:
                amount = quantity(asked[name]) if name in asked else quantity(policy.get("default") or "0")
                valid = sorted(quantity(v) for v in policy.get("validValues") or ())
                if valid:
                    bigger = [v for v in valid if v >= amount]
                    if not bigger:
                        return None
                    amount = bigger[0]
            if used.get(name, 0) + amount > total:
                return None
            consumed[name] = amount
        return consumed

    def _request(self, ref, name, spec, node, picked):
        """The results of one (sub)request `spec` named `name`; Unallocatable when it does not fit."""
        device_class = self.classes.get(spec.get("deviceClassName"))
        if device_class is None:
            raise Unallocatable("%s, request %s: device class %s does not exist" % (ref, name, spec.get("deviceClassName")))
        mode = spec.get("allocationMode") or "ExactCount"
        count = None if mode == "All" else int(spec.get("count") or 1)
        results, busy = [], []
        for driver, pool, device in self.devices_on(node):
            key = (driver, pool, device["name"])
            if key in picked and not device.get("allowMultipleAllocations"):
                continue
            if not self._selected((device_class.get("spec") or {}).get("selectors"), driver, device,
                                  "%s, device class %s" % (ref, device_class["metadata"]["name"])):
                continue
            if not self._selected(spec.get("selectors"), driver, device, "%s, request %s" % (ref, name)):
                continue
            if untolerated(device, spec.get("tolerations")):
                continue
            while count is None or len(results) < count:
                result = {"request": name, "driver": driver, "pool": pool, "device": device["name"]}
                if device.get("allowMultipleAllocations"):
                    consumed = self._consumption(key, device, spec)
                    if consumed is None or (not self.in_use(key) and not self._counters_fit(key, device)):
                        break
                    result.update(shareID=str(uuid.uuid4()),
                                  consumedCapacity={k: str(v) for k, v in consumed.items()})
                elif self.in_use(key) or not self._counters_fit(key, device):
                    busy.append(result)
                    break
                self._add(result)
                picked.add(key)
                results.append(result)
                if not device.get("allowMultipleAllocations") or count is None:
                    break   # All: each matching device once
            if count is not None and len(results) >= count:
                break
        if self.overallocate and count is not None and len(results) < count:
            results += busy[:count - len(results)]   # the injected bug: hand out devices other claims hold
        if (count is not None and len(results) < count) or not results:
            raise Unallocatable(CANNOT_ALLOCATE)
        return results

    def allocate(self, claim, node):
        """The claim's allocation on `node`, or Unallocatable; what it takes counts for later claims only after
        commit() (a failed claim leaves the state as it was)."""
        ref = "claim %s/%s" % (claim["metadata"].get("namespace"), claim["metadata"]["name"])
        unmodelled(ref, claim)
        saved = self.snapshot()
        results, picked = [], set()
        try:
            for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
                if request.get("exactly") is not None:
                    results += self._request(ref, request.get("name"), request["exactly"], node, picked)
                    continue
                choices = request.get("firstAvailable")
                if not choices:
                    raise Unallocatable("%s, request %s: neither exactly nor firstAvailable" % (ref, request.get("name")))
                for sub in choices:   # DeviceRequest.FirstAvailable: the first subrequest that fits wins
                    before = self.snapshot(), set(picked)
                    try:
                        results += self._request(ref, "%s/%s" % (request.get("name"), sub.get("name")), sub, node,
                                                 picked)
                        break
                    except Unallocatable:
                        self.restore(before[0])
                        picked = before[1]
                else:
                    raise Unallocatable(CANNOT_ALLOCATE)
        finally:
            self.restore(saved)
        return {"devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}

    def commit(self, allocation):
        for result in allocation["devices"]["results"]:
            self._add(result)


def untolerated(device, tolerations):
    """Whether `device` has a NoSchedule or NoExecute taint that none of `tolerations` (a request's
    resource/v1 DeviceToleration list) tolerates: kube-scheduler allocates no new claim such a device."""
    for taint in device.get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                tolerates(toleration, taint) for toleration in tolerations or ()):
            return True
    return False


def tolerates(toleration, taint):
    """resource/v1 DeviceToleration.ToleratesTaint: the effect (empty: any), then Exists (the key, or any key when
    empty) or Equal (key and value)."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def unmodelled(ref, claim):
    """Unallocatable for a claim that asks what DraAllocator does not model (constraints, admin access): the real
    allocator honours them (structured/allocator.go: constraints per claim; adminAccess devices are not counted as
    allocated), so allocating as if they were absent would let a test pass that the real scheduler fails."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    if devices.get("constraints"):
        raise Unallocatable("%s: constraints are not modelled by the test double (tests/fakes/vmi_controller.py "
                            "DraAllocator); not allocated" % ref)
    for request in devices.get("requests") or []:
        for spec in [request.get("exactly") or {}] + list(request.get("firstAvailable") or []):
            if spec.get("adminAccess"):
                raise Unallocatable("%s, request %s: adminAccess is not modelled by the test double "
                                    "(tests/fakes/vmi_controller.py DraAllocator); not allocated"
                                    % (ref, request.get("name")))


_SUFFIXES = {"Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4, "k": 1000, "M": 1000 ** 2,
             "G": 1000 ** 3, "T": 1000 ** 4}


def quantity(text):
    """A resource.Quantity string as an int (whole units; the values used here are integral)."""
    text = str(text or "0").strip()
    for suffix, factor in sorted(_SUFFIXES.items(), key=lambda item: -len(item[0])):
        if text.endswith(suffix):
            return int(text[:-len(suffix)]) * factor
    return int(text)


def template_claim(vmi, entry, template):
    """The ResourceClaim the resourceclaim controller creates for the launcher pod's claim `entry` (a
    `resourceClaimTemplateName` one) from `template` (kubernetes pkg/controller/resourceclaim/controller.go,
    handleClaim): generateName `<pod>-<claim>-` (over 57 characters both parts cut in proportion, no trailing
    hyphen), the pod as its controlling owner (blockOwnerDeletion), the template's labels and annotations plus
    `resource.kubernetes.io/pod-claim-name: <claim>`, the template's spec.spec as its spec. The pod is the VMI's
    stand-in (consumer()): name `virt-launcher-<vmi>`, the VMI's UID."""
    pod = consumer(vmi)
    base = "%s-%s-" % (pod["name"], entry["name"])
    if len(base) > 57:
        base = pod["name"][:len(pod["name"]) * 57 // len(base)] + "-" + entry["name"][:len(entry["name"]) * 57 // len(base)]
    meta = (template.get("spec") or {}).get("metadata") or {}
    annotations = dict(meta.get("annotations") or {}, **{POD_CLAIM_NAME: entry["name"]})
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"generateName": base, "namespace": vmi["metadata"].get("namespace"), "annotations": annotations,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod["name"], "uid": pod["uid"],
                                              "controller": True, "blockOwnerDeletion": True}]},
            "spec": (template.get("spec") or {}).get("spec") or {}}
    if meta.get("labels"):
        body["metadata"]["labels"] = dict(meta["labels"])
    return body


def owned_claim(vmi, entry, claims):
    """The claim made for the launcher pod's template claim `entry`, if there is one (findPodResourceClaim in the same
    controller: owned by the pod, annotated with the pod's claim name). The real controller looks first in
    pod.status.resourceClaimStatuses, which it writes after the create; this fake runs no pod object, so the owner and
    the annotation, the controller's own fallback, are how it finds the claim again."""
    uid = vmi["metadata"].get("uid")
    for (namespace, dummy), claim in sorted(claims.items()):
        meta = claim["metadata"]
        if (namespace == vmi["metadata"].get("namespace")
                and any(o.get("uid") == uid and o.get("controller") for o in meta.get("ownerReferences") or ())
                and (meta.get("annotations") or {}).get(POD_CLAIM_NAME) == entry["name"]):
            return claim
    return None


def allocation_results(claim):
    return (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []


def allocated_node(claim):
    """The node an allocated claim is bound to (the nodeSelector the allocator wrote), None when unallocated."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    for term in ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []):
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return field["values"][0]
    return ""   # allocated for any node


def _int(value):
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def requests_of(vmi):
    devices = ((vmi.get("spec") or {}).get("domain") or {}).get("devices") or {}
    return Counter(d.get("deviceName") for d in (devices.get("gpus") or []) + (devices.get("hostDevices") or [])
                   if d.get("deviceName"))


def selects(vmi, node):
    labels = (node.get("metadata") or {}).get("labels") or {}
    wanted = (vmi.get("spec") or {}).get("nodeSelector") or {}
    return all(labels.get(key) == value for key, value in wanted.items())


class VmiController(threading.Thread):
    """Run as a thread (tests) or through main() as a process (demo)."""

    def __init__(self, api_url, never_ready=(), block_overallocation=True, interval=0.05):
        super().__init__(daemon=True)
        self.api_url, self.interval = api_url.rstrip("/"), interval
        self.never_ready, self.block = set(never_ready), block_overallocation
        self.stopped = threading.Event()
        self.errors = []

    def _request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json" if method == "POST" else "application/merge-patch+json"} \
            if data else {}
        req = urllib.request.Request(self.api_url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def _patch_status(self, vmi, status):
        meta = vmi["metadata"]
        path = "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances/%s" % (meta["namespace"], meta["name"])
        try:
            self._request("PATCH", path, {"status": status})
        except urllib.error.HTTPError as exc:
            if exc.code != 404:   # deleted meanwhile
                raise

    def _items(self, path):
        """The listed items, None where the API server does not serve the resource (404)."""
        try:
            return self._request("GET", path).get("items") or []
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _claims(self):
        items = self._items(DRA + "resourceclaims")
        return None if items is None else dict(
            ((c["metadata"].get("namespace"), c["metadata"]["name"]), c) for c in items)

    def _patch_claim(self, claim, patch):
        meta = claim["metadata"]
        path = DRA + "namespaces/%s/resourceclaims/%s" % (meta["namespace"], meta["name"])
        try:
            self._request("PATCH", path, patch)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise

    def _release(self, claims, vmis):
        """The resourceclaim controller: drop consumers that are gone from status.reservedFor; a claim that
        was in use and is not anymore (or is being deleted and unused) is deallocated and loses the
        delete-protection finalizer (kubernetes pkg/controller/resourceclaim syncClaim). True if it wrote."""
        alive = set(v["metadata"].get("uid") for v in vmis)
        wrote = False
        for claim in claims.values():
            status, meta = claim.get("status") or {}, claim["metadata"]
            reserved = status.get("reservedFor") or []
            valid = [r for r in reserved if r.get("uid") in alive]
            unused = not valid and (reserved or meta.get("deletionTimestamp"))
            if valid == reserved and not unused:
                continue
            patch = {"status": {"reservedFor": valid or None}}
            if unused:
                patch["status"]["allocation"] = None
                finalizers = [f for f in meta.get("finalizers") or [] if f != DELETE_PROTECTION]
                patch["metadata"] = {"finalizers": finalizers or None}
            self._patch_claim(claim, patch)
            wrote = True
        return wrote

    def step(self):
        """One reconcile pass over every VMI."""
        nodes = sorted(self._request("GET", NODES).get("items") or [], key=lambda n: n["metadata"]["name"])
        vmis = self._items(VMIS)
        if vmis is None:   # no VMI resource known yet
            return
        claims = self._claims()
        if claims is not None and self._release(claims, vmis):
            claims = self._claims()
        dra = None
        if claims is not None and any((v.get("spec") or {}).get("resourceClaims") for v in vmis):
            dra = DraAllocator(self._items(DRA + "deviceclasses") or [], self._items(DRA + "resourceslices") or [],
                               claims, overallocate=not self.block)
        used = Counter()
        for vmi in vmis:
            placed = (vmi.get("status") or {}).get("nodeName")
            if placed:
                for res, count in requests_of(vmi).items():
                    used[placed, res] += count
        for vmi in vmis:
            if (vmi.get("metadata") or {}).get("deletionTimestamp"):
                continue
            status = vmi.get("status") or {}
            phase = status.get("phase")
            if not phase:
                self._patch_status(vmi, {"phase": "Pending"})
            elif phase == "Pending":
                self._schedule(vmi, nodes, used, claims, dra)
            elif phase in NEXT:
                self._patch_status(vmi, {"phase": NEXT[phase]})
            elif phase == "Running" and not any(c.get("type") == "Ready" for c in status.get("conditions") or []):
                ready = vmi["metadata"]["name"] not in self.never_ready
                self._patch_status(vmi, {"conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                                         "reason": "" if ready else "GuestNotReady"}]})

    def _pod_claims(self, vmi, claims):
        """The ResourceClaims the VMI's launcher pod would reference (a template's claim created first, as the
        resourceclaim controller does before the pod can be scheduled); Unallocatable when one cannot be used."""
        found = []
        for entry in (vmi.get("spec") or {}).get("resourceClaims") or []:
            if claims is None:
                raise Unallocatable("resource.k8s.io/v1 is not served")
            if entry.get("resourceClaimTemplateName"):
                claim = owned_claim(vmi, entry, claims) or self._create_from_template(vmi, entry, claims)
            elif entry.get("resourceClaimName"):
                claim = claims.get((vmi["metadata"].get("namespace"), entry["resourceClaimName"]))
                if claim is None:
                    raise Unallocatable('resourceclaim "%s" not found' % entry["resourceClaimName"])
            else:
                raise Unallocatable("claim %s: neither resourceClaimName nor resourceClaimTemplateName" % entry.get("name"))
            if claim["metadata"].get("deletionTimestamp"):
                raise Unallocatable('resourceclaim "%s" is being deleted' % claim["metadata"]["name"])
            found.append(claim)
        return found

    def _create_from_template(self, vmi, entry, claims):
        """POST the claim of a template entry (template_claim); it counts in `claims` from now on."""
        namespace, name = vmi["metadata"].get("namespace"), entry["resourceClaimTemplateName"]
        if not vmi["metadata"].get("uid"):
            raise Unallocatable("VMI %s has no UID to own its claim %s" % (vmi["metadata"]["name"], entry["name"]))
        try:
            template = self._request("GET", DRA + "namespaces/%s/resourceclaimtemplates/%s" % (namespace, name))
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            raise Unallocatable('resource claim template "%s": not found' % name) from None
        claim = self._request("POST", DRA + "namespaces/%s/resourceclaims" % namespace,
                              template_claim(vmi, entry, template))
        claims[(namespace, claim["metadata"]["name"])] = claim
        return claim

    def _allocate_on(self, vmi, pod_claims, node, dra):
        """{claim key: allocation} for the VMI's claims on `node` (allocated ones must be for it); commits."""
        name, saved, fresh = node["metadata"]["name"], dra.snapshot(), {}
        try:
            for claim in pod_claims:
                bound = allocated_node(claim)
                if bound is None:
                    fresh[claim["metadata"]["name"]] = allocation = dra.allocate(claim, name)
                    dra.commit(allocation)
                elif bound not in ("", name):
                    raise Unallocatable(CANNOT_ALLOCATE)
        except Unallocatable:
            dra.restore(saved)
            raise
        return fresh

    def _reserve(self, vmi, pod_claims, fresh):
        for claim in pod_claims:
            status = claim.get("status") or {}
            patch = {"status": {"reservedFor": (status.get("reservedFor") or []) + [consumer(vmi)]}}
            if claim["metadata"]["name"] in fresh:
                patch["status"]["allocation"] = fresh[claim["metadata"]["name"]]
                finalizers = claim["metadata"].get("finalizers") or []
                patch["metadata"] = {"finalizers": finalizers + [DELETE_PROTECTION] * (DELETE_PROTECTION not in finalizers)}
            self._patch_claim(claim, patch)

    def _schedule(self, vmi, nodes, used, claims=None, dra=None):
        wanted = requests_of(vmi)
        candidates = [n for n in nodes if selects(vmi, n)]

        def room(node):
            alloc = (node.get("status") or {}).get("allocatable") or {}
            name = node["metadata"]["name"]
            return all(used[name, res] + count <= _int(alloc.get(res)) for res, count in wanted.items())

        fitting = [n for n in candidates if room(n)]
        if not fitting and not self.block:
            fitting = candidates   # the broken scheduler: over-allocates
        unallocatable = Counter()
        try:
            pod_claims = self._pod_claims(vmi, claims)
        except Unallocatable as exc:
            pod_claims, unallocatable[str(exc)] = None, len(fitting)
            fitting = []
        for node in fitting:
            fresh = {}
            if pod_claims:
                try:
                    fresh = self._allocate_on(vmi, pod_claims, node, dra)
                except Unallocatable as exc:
                    unallocatable[str(exc)] += 1
                    continue
                self._reserve(vmi, pod_claims, fresh)
            name = node["metadata"]["name"]
            for res, count in wanted.items():
                used[name, res] += count
            self._patch_status(vmi, {"phase": "Scheduling", "nodeName": name, "conditions": []})
            return
        short = sorted(res for res, count in wanted.items()
                       if all(used[n["metadata"]["name"], res] + count > _int(
                           ((n.get("status") or {}).get("allocatable") or {}).get(res)) for n in candidates))
        message = "0/%d nodes are available: %s" % (len(nodes), ", ".join(
            ["%d %s" % (count, why) for why, count in sorted(unallocatable.items())]
            + ["%d node(s) didn't match Pod's node affinity/selector" % (len(nodes) - len(candidates))]
            * (len(candidates) < len(nodes)) + ["%d Insufficient %s" % (len(candidates), res) for res in short]))
        conditions = (vmi.get("status") or {}).get("conditions") or []
        if not any(c.get("reason") == "Unschedulable" and c.get("message") == message for c in conditions):
            self._patch_status(vmi, {"conditions": [{"type": "PodScheduled", "status": "False",
                                                     "reason": "Unschedulable", "message": message}]})

    def run(self):
        while not self.stopped.is_set():
            try:
                self.step()
            except (OSError, ValueError) as exc:   # keep going: the API server may be restarting
                self.errors.append(str(exc))
            self.stopped.wait(self.interval)

    def stop(self):
        self.stopped.set()
        self.join(timeout=10)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", required=True, help="URL of the API server double")
    parser.add_argument("--never-ready", action="append", default=[], help="VMI name that never becomes Ready")
    parser.add_argument("--no-block", action="store_true", help="do not block over-allocation (a broken scheduler)")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between passes (default %(default)s)")
    args = parser.parse_args(argv)
    controller = VmiController(args.api, args.never_ready, not args.no_block, args.interval)
    print("ready", flush=True)
    try:
        controller.run()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
