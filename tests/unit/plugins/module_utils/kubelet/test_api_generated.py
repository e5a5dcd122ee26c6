"""The generated gRPC modules match the .proto files, carry the published names, and load on the runtime the
agent image ships (Debian 12's python3-grpcio and python3-protobuf)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import (
    deviceplugin_v1beta1_pb2 as dp, pluginregistration_v1_pb2 as reg)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 5))
DEBIAN_PYTHON = "/usr/bin/python3"


def test_checked_in_modules_are_what_the_protos_generate():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen-kubelet-api.py"), "--check"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_method_paths_and_field_numbers_are_the_published_ones():
    plugin = dp.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert plugin.full_name == "v1beta1.DevicePlugin"
    assert [m.name for m in plugin.methods] == ["GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation",
                                                "Allocate", "PreStartContainer"]
    assert dp.DESCRIPTOR.services_by_name["Registration"].full_name == "v1beta1.Registration"
    assert reg.DESCRIPTOR.services_by_name["Registration"].full_name == "pluginregistration.Registration"
    numbers = dict((f.name, f.number) for f in dp.ContainerAllocateResponse.DESCRIPTOR.fields)
    assert numbers == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    assert [(f.name, f.number) for f in dp.Device.DESCRIPTOR.fields] == [("ID", 1), ("health", 2), ("topology", 3)]
    assert [(f.name, f.number) for f in reg.PluginInfo.DESCRIPTOR.fields] == [
        ("type", 1), ("name", 2), ("endpoint", 3), ("supported_versions", 4)]


def test_the_podresources_api_keeps_the_published_names_and_numbers():
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import (
        dra_health_v1_pb2, podresources_v1_pb2 as pr)
    lister = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert lister.full_name == "v1.PodResourcesLister"      # the same proto package as DRA health v1: both load
    assert dra_health_v1_pb2.DESCRIPTOR.package == pr.DESCRIPTOR.package == "v1"
    assert [m.name for m in lister.methods] == ["List", "GetAllocatableResources", "Get"]
    assert [(f.name, f.number) for f in pr.ContainerDevices.DESCRIPTOR.fields] == [
        ("resource_name", 1), ("device_ids", 2), ("topology", 3)]
    assert [(f.name, f.number) for f in pr.ContainerResources.DESCRIPTOR.fields] == [
        ("name", 1), ("devices", 2), ("cpu_ids", 3), ("memory", 4), ("dynamic_resources", 5)]
    assert [(f.name, f.number) for f in pr.PodResources.DESCRIPTOR.fields] == [
        ("name", 1), ("namespace", 2), ("containers", 3)]
    assert [(f.name, f.number) for f in pr.DynamicResource.DESCRIPTOR.fields] == [
        ("claim_name", 2), ("claim_namespace", 3), ("claim_resources", 4)]
    assert [(f.name, f.number) for f in pr.GetPodResourcesRequest.DESCRIPTOR.fields] == [
        ("pod_name", 1), ("pod_namespace", 2)]


def test_an_allocate_response_encodes_as_the_wire_format_says():
    # field 1 (envs, a map entry = message {1: key, 2: value}), length-delimited: tag 0x0a
    data = dp.ContainerAllocateResponse(envs={"A": "b"}).SerializeToString()
    assert data == b"\x0a\x06\x0a\x01A\x12\x01b"


@pytest.mark.skipif(not os.access(DEBIAN_PYTHON, os.X_OK), reason="no Debian python3 here")
def test_the_modules_load_and_round_trip_on_the_debian_runtime():
    code = ("import grpc\n"
            "from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import transport\n"
            "from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import "
            "deviceplugin_v1beta1_pb2 as dp\n"
            "r = dp.ListAndWatchResponse(devices=[dp.Device(ID='0000:41:00.4', health='Healthy')])\n"
            "assert dp.ListAndWatchResponse.FromString(r.SerializeToString()) == r\n"
            "from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import pod_resources\n"
            "from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import dra_health_v1_pb2\n"
            "p = pod_resources.pb.ListPodResourcesResponse(pod_resources=[pod_resources.pb.PodResources(name='a')])\n"
            "assert pod_resources.pb.ListPodResourcesResponse.FromString(p.SerializeToString()) == p\n"
            "print(grpc.__version__)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, ".build", "collections"))
    result = subprocess.run([DEBIAN_PYTHON, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
