"""ResourceClaims (resource.k8s.io/v1) as the scheduler leaves them, and a claim store that answers
like the stdlib API client (KubeApiError with the HTTP status)."""

import copy

from ansible_collections.accelops.vgpu.plugins.module_utils.kube_errors import KubeApiError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimRef
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.slices import pool_name

DRIVER = "vgpu.accelops.io"


def claim(name, uid, devices, node, namespace="vms", annotations=None, other_driver=None, pool=None):
    """A claim with one request per device (`gpu`, `gpu2`, ...), allocated on `node`'s pool (`pool`: another name,
    such as the node's own, the pool before issue 40)."""
    requests, results = [], []
    for index, device in enumerate(devices):
        request = "gpu" if index == 0 else "gpu%d" % (index + 1)
        exactly = {"deviceClassName": "vgpu.accelops.io", "count": 1, "allocationMode": "ExactCount"}
        requests.append({"name": request, "exactly": exactly})
        results.append({"request": request, "driver": DRIVER, "pool": pool or pool_name(node), "device": device})
    if other_driver:
        results.append({"request": "nic", "driver": other_driver, "pool": node, "device": "eth0"})
    meta = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "7"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": requests}},
            "status": {"allocation": {"devices": {"results": results}}}}


def ref(obj):
    return ClaimRef(obj["metadata"]["namespace"], obj["metadata"]["name"], obj["metadata"]["uid"])


class ClaimStore:
    """get(namespace, name) over a dict of claims; counts the reads."""

    def __init__(self, *objects):
        self.objects = {(o["metadata"]["namespace"], o["metadata"]["name"]): copy.deepcopy(o) for o in objects}
        self.reads = 0

    def get(self, namespace, name):
        self.reads += 1
        try:
            return copy.deepcopy(self.objects[namespace, name])
        except KeyError:
            raise KubeApiError('GET resourceclaims: resourceclaims.resource.k8s.io "%s" not found' % name, 404,
                               "NotFound") from None
