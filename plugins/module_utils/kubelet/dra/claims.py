# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a ResourceClaim (resource.k8s.io/v1) allocated to this driver, as plain data.

The kubelet's NodePrepareResources names a claim by namespace, name and UID only
(k8s.io/kubelet pkg/apis/dra/v1 api.proto `Claim`): the driver reads the claim from the API server,
checks the UID (a claim deleted and re-created under the same name is another claim) and takes the
entries of `status.allocation.devices.results[]` whose `driver` is its own.
"""

from __future__ import annotations

from collections import namedtuple

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, shown

POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"   # k8s.io/api resource/v1 PodResourceClaimAnnotation


class ClaimError(EngineError):
    """One claim cannot be prepared; the message names it."""


class ClaimRef(namedtuple("ClaimRef", "namespace name uid")):
    """The kubelet's `Claim{namespace, uid, name}`."""

    __slots__ = ()

    def __str__(self):
        return "claim %s/%s" % (shown(self.namespace), shown(self.name))


Allocated = namedtuple("Allocated", "request pool device")   # one result of this driver
# one allocated device as Prepare resolved it: `device` is the devices.DraDevice that `Allocated.device` names
PreparedDevice = namedtuple("PreparedDevice", "request pool device")


def base_request(request):
    """`gpu` for `gpu/high-memory` (a FirstAvailable subrequest): files are per request."""
    return request.split("/", 1)[0]


def results(ref, claim, driver):
    """[Allocated] of `driver` in `claim` (the API object); ClaimError for a claim that is not the
    one the kubelet means or is not allocated."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise ClaimError("%s: its UID is %s, the kubelet asked for %s (the claim was deleted and re-created)"
                         % (ref, shown(meta.get("uid")), shown(ref.uid)))
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError("%s: not allocated (status.allocation is empty)" % (ref,))
    found = []
    for result in (allocation.get("devices") or {}).get("results") or ():
        if result.get("driver") == driver:
            found.append(Allocated(str(result.get("request") or ""), str(result.get("pool") or ""),
                                   str(result.get("device") or "")))
    return found


def pod_claim_name(claim):
    """The pod's name for a claim generated from a ResourceClaimTemplate, else None."""
    return ((claim.get("metadata") or {}).get("annotations") or {}).get(POD_CLAIM_NAME) or None


def allocated_devices(claims_, driver, pools):
    """{(pool, device)} that ResourceClaims (API objects) have allocated from `driver`'s pools `pools`."""
    found = set()
    for claim in claims_ or ():
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            if result.get("driver") == driver and result.get("pool") in pools:
                found.add((result.get("pool"), result.get("device")))
    return found


def prepared_devices(entries, pools):
    """{(pool, device)} the driver's checkpoint records ({uid: entry}, started or completed) in `pools`."""
    return {(record.get("pool"), record.get("device")) for entry in (entries or {}).values()
            for record in entry.get("devices") or () if record.get("pool") in pools}
