# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""This node's ResourceSlices (resource.k8s.io/v1) as plain data, and the writes that make the API match.

One pool per node, `<node>/<driver>` (pool_name); its devices are split into slices of at most
MAX_DEVICES_PER_SLICE (the API's limit for devices without taints or counters; 64 when a device consumes
counters), and the counter sets of claim-time GPUs (kubelet/dra/claim_time.py) come first, in slices of
their own (at most 8 counter sets each). Every slice of the
pool carries the same `pool.generation` and `pool.resourceSliceCount`; the scheduler uses only the
slices of a pool's highest generation and treats the pool as incomplete until it sees
resourceSliceCount of them, so a change that needs more than one write bumps the generation and
rewrites every slice (the rule of k8s.io/dynamic-resource-allocation resourceslice.Controller.syncPool;
one write alone keeps it). Slice names are fixed, `<node>-<driver>-<index>`, so a restarted agent
finds its own slices again; the node's slices of this driver with another name, pool or a lower
generation are stale and deleted first: this is also how the pool named after the node alone (earlier releases)
is replaced, slice by slice under the same names, when the agent moves to `<node>/<driver>`.

Why not the node's name alone: kube-scheduler 1.36 before kubernetes#140504 (the release-1.36 backport of #140435)
keys its counter cache by pool name only, so another driver's pool named after the node (NVIDIA's GPU DRA driver
names its pool so) can shadow our counters within one pod's scheduling cycle. A pool name is one or more DNS
subdomains separated by `/`, at most 253 characters (resource/v1 ResourcePool.Name), so `<node>/<driver>` is
valid for any node name that fits (a longer one keeps its start and a hash, as slice names do). The pool name
of earlier releases, the node's name, is still accepted on input (claims allocated before the upgrade: pools()).

    pool_name(node) -> `<node>/vgpu.accelops.io`;  pools(node) -> (pool_name(node), node): what claims may name
    desired_slices(node, devices, generation, node_uid=None, pool=None) -> [slice bodies, no metadata.resourceVersion]
    plan(node, devices, existing, node_uid=None, pool=None) -> Plan(deletes, updates, creates)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DRIVER

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_COUNTERS = 64      # when a device of the slice consumes counters (or has taints)
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_NAME = 253


def slice_name(node, index, driver=DRIVER):
    """`<node>-<driver>-<index>`; a node name too long for that keeps its start and a hash."""
    return _shortened(node, "-%s-%d" % (driver, index))


def _shortened(node, tail):
    """`node` + `tail` within MAX_NAME: a node name too long keeps its start and a hash of the whole name."""
    if len(node) + len(tail) <= MAX_NAME:
        return node + tail
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return node[:MAX_NAME - len(tail) - len(digest) - 1].rstrip("-.") + "-" + digest + tail


def pool_name(node, driver=DRIVER):
    """This node's pool: `<node>/<driver>` (module docstring: why not the node's name alone)."""
    return _shortened(node, "/" + driver)


def pools(node, driver=DRIVER):
    """The pool names a claim of this node may name: ours, then the node's name (the pool of earlier releases)."""
    return (pool_name(node, driver), node)


def chunks(devices, size=MAX_DEVICES_PER_SLICE):
    """[(spec field, entries)]: the counter sets of claim-time GPUs (items with `shared_counters`,
    kubelet/dra/claim_time.py) in slices of their own, at most MAX_COUNTER_SETS_PER_SLICE each (since 1.35 a
    slice carries devices or sharedCounters, not both), then the devices, at most `size` per slice (64 when
    any consumes counters). An empty pool is one empty device slice (the pool stays published, with no
    devices, so the scheduler knows it is complete)."""
    sets = [item.to_api() for item in devices if getattr(item, "shared_counters", False)]
    entries = [item.to_api() for item in devices if not getattr(item, "shared_counters", False)]
    if any(getattr(item, "consumes_counters", False) for item in devices):
        size = min(size, MAX_DEVICES_WITH_COUNTERS)
    parts = [("sharedCounters", sets[i:i + MAX_COUNTER_SETS_PER_SLICE])
             for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)]
    parts += [("devices", entries[i:i + size]) for i in range(0, len(entries), size)]
    return parts if entries else parts + [("devices", [])]


def desired_slices(node, devices, generation, node_uid=None, driver=DRIVER, pool=None):
    """The full ResourceSlice objects for `devices` at `generation`, in pool `pool` (default: pool_name)."""
    pool = pool or pool_name(node, driver)
    parts = chunks(devices)
    slices = []
    for index, (kind, entries) in enumerate(parts):
        metadata = {"name": slice_name(node, index, driver)}
        if node_uid:
            # the Node owns its slices: they go when the Node object goes (the kubelet plugin helper does the same)
            metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                            "controller": True}]
        slices.append({"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata,
                       "spec": {"driver": driver, "nodeName": node, kind: entries,
                                "pool": {"name": pool, "generation": generation, "resourceSliceCount": len(parts)}}})
    return slices


@dataclass
class Plan:
    """Writes in order: deletes (stale slices, resourceVersion-guarded), updates, creates."""

    deletes: list = field(default_factory=list)     # [(name, resourceVersion)]
    updates: list = field(default_factory=list)     # [slice body with metadata.resourceVersion]
    creates: list = field(default_factory=list)     # [slice body]

    @property
    def empty(self):
        return not (self.deletes or self.updates or self.creates)


def _spec_view(item):
    spec = item.get("spec") or {}
    return (spec.get("pool"), [_without_taint_times(d) for d in spec.get("devices") or []],
            spec.get("sharedCounters") or [], spec.get("nodeName"), spec.get("driver"))


def _without_taint_times(device):
    """A device entry without its taints' `timeAdded`: the API server sets it on a write that leaves it out
    (resource/v1 DeviceTaint.TimeAdded), so a listing publish compares what we send."""
    if not device.get("taints"):
        return device
    return dict(device, taints=[{k: v for k, v in taint.items() if k != "timeAdded"} for taint in device["taints"]])


def _owners_view(item):
    return (item.get("metadata") or {}).get("ownerReferences") or None


def plan(node, devices, existing, node_uid=None, driver=DRIVER, pool=None):
    """What to write so that the API holds exactly this node's pool `pool` (default: pool_name) of `devices`; every
    other slice of the node and driver (another pool, such as the node's name, the pool of earlier releases) is deleted.

    `existing` are the ResourceSlices the API lists for spec.nodeName=node, spec.driver=driver."""
    pool = pool or pool_name(node, driver)
    existing = [item for item in existing or () if (item.get("spec") or {}).get("driver") == driver
                and (item.get("spec") or {}).get("nodeName") == node]
    ours = [item for item in existing if ((item.get("spec") or {}).get("pool") or {}).get("name") == pool]
    generation = max([int(((item["spec"].get("pool") or {}).get("generation")) or 0) for item in ours] or [0])
    by_name = {item["metadata"]["name"]: item for item in ours
               if int((item["spec"].get("pool") or {}).get("generation") or 0) == generation}
    wanted = desired_slices(node, devices, generation, node_uid, driver, pool)
    changed = [body for body in wanted if body["metadata"]["name"] not in by_name
               or _spec_view(by_name[body["metadata"]["name"]]) != _spec_view(body)
               or _owners_view(by_name[body["metadata"]["name"]]) != _owners_view(body)]
    new = [body for body in wanted if body["metadata"]["name"] not in by_name]
    if new or len(changed) > 1 or not ours:
        generation += 1
        wanted = desired_slices(node, devices, generation, node_uid, driver, pool)
        changed = wanted
    names = {body["metadata"]["name"] for body in wanted}
    result = Plan()
    for item in existing:
        name = item["metadata"]["name"]
        if item not in by_name.values() or name not in names:
            result.deletes.append((name, item["metadata"].get("resourceVersion")))
    for body in changed:
        name = body["metadata"]["name"]
        if name in by_name and name not in dict(result.deletes):
            version = by_name[name]["metadata"].get("resourceVersion")
            if version:     # the update's precondition: a concurrent change makes it a 409
                body["metadata"]["resourceVersion"] = version
            result.updates.append(body)
        else:
            result.creates.append(body)
    return result
