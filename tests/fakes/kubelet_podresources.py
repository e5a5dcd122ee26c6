"""The test kubelet's PodResources API v1: the devices its live pods were allocated, as the kubelet publishes them.

The real one [kubernetes pkg/kubelet/apis/podresources/server_v1.go (v1PodResourcesServer.List, Get,
GetAllocatableResources), pkg/kubelet/cm/devicemanager/pod_devices.go; API kubernetes/kubelet
pkg/apis/podresources/v1/api.proto] serves `v1.PodResourcesLister` on `<kubelet dir>/pod-resources/kubelet.sock`;
List answers every active pod with, per container, ContainerDevices{resource_name, device_ids} of the devices the
device manager allocated (recorded once the plugin's Allocate returned); Get one pod (NotFound when the pod is not
active); GetAllocatableResources the devices of every registered resource. A pod the kubelet no longer runs is
not listed. The state survives a kubelet restart (the device manager's checkpoint), so `restart()` leaves it.

Tests drive it through TestKubelet (kubelet_double.py): `run_pod()` allocates and records, `delete_pod()` ends one;
`unavailable` makes every call fail (UNAVAILABLE), as a kubelet that does not answer.
"""

from __future__ import annotations

import os
import threading
from concurrent import futures

import grpc

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import (
    podresources_v1_pb2 as pb, podresources_v1_pb2_grpc as pb_grpc)


class PodResourcesServer(pb_grpc.PodResourcesListerServicer):
    """`pods`: {(namespace, name): {container: [(resource, [ids])]}}; `allocatable()` -> {resource: [ids]}."""

    def __init__(self, root, allocatable=dict):
        self.path = os.path.join(root, "pod-resources", "kubelet.sock")
        self.allocatable = allocatable
        self.pods = {}
        self.unavailable = False
        self.calls = []
        self._lock = threading.Lock()
        self.server = None

    def start(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        if not self.server.add_insecure_port("unix:" + self.path):
            raise RuntimeError("test kubelet: cannot bind %s" % self.path)
        self.server.start()
        return self

    def stop(self):
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None

    def add(self, namespace, name, container, resource, ids):
        with self._lock:
            self.pods.setdefault((namespace, name), {}).setdefault(container, []).append((resource, list(ids)))

    def delete(self, namespace, name):
        with self._lock:
            return self.pods.pop((namespace, name), None) is not None

    def _pod(self, key, containers):
        return pb.PodResources(namespace=key[0], name=key[1], containers=[
            pb.ContainerResources(name=container, devices=[
                pb.ContainerDevices(resource_name=resource, device_ids=ids) for resource, ids in devices])
            for container, devices in sorted(containers.items())])

    def _check(self, method, context):
        self.calls.append(method)
        if self.unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "test kubelet: PodResources unavailable")

    def List(self, request, context):  # noqa: N802 (gRPC method names)
        self._check("List", context)
        with self._lock:
            return pb.ListPodResourcesResponse(pod_resources=[self._pod(k, c) for k, c in sorted(self.pods.items())])

    def Get(self, request, context):  # noqa: N802
        self._check("Get", context)
        with self._lock:
            containers = self.pods.get((request.pod_namespace, request.pod_name))
            if containers is None:
                context.abort(grpc.StatusCode.NOT_FOUND, "pod %s not found in namespace %s" % (
                    request.pod_name, request.pod_namespace))
            return pb.GetPodResourcesResponse(pod_resources=self._pod((request.pod_namespace, request.pod_name),
                                                                      containers))

    def GetAllocatableResources(self, request, context):  # noqa: N802
        self._check("GetAllocatableResources", context)
        return pb.AllocatableResourcesResponse(devices=[
            pb.ContainerDevices(resource_name=resource, device_ids=ids)
            for resource, ids in sorted(self.allocatable().items())])
