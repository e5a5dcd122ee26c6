"""What a node publishes for claim-time GPUs (kubelet/dra/claim_time.py, slices.py): counter slices apart from
device slices, the API's limits, strict 1.36/1.37 schemas, no pciBusID on an abstract device."""

import pathlib
import re

import kubernetes_validate
import pytest
import yaml
from cel_devices import selected

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time, slices
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration

NODE = "gpu-node-1"
L40S = (("L40S-48Q", 1156, 1), ("L40S-24Q", 1155, 2), ("L40S-16Q", 1154, 3), ("L40S-12Q", 1153, 4),
        ("L40S-8Q", 1152, 6))


def claim_time_result(gpus, profiles=L40S):
    return [{"address": "0000:%02x:00.0" % (0x41 + gpu), "model": "L40S", "vfs": 16, "allow": None,
             "profiles": [{"profile": p, "type_name": "NVIDIA " + p, "type_id": t, "max_instances": n,
                           "size_mib": int(p.split("-")[1][:-1]) * 1024} for p, t, n in profiles]}
            for gpu in range(gpus)]


def offers(gpus, profiles=L40S):
    return claim_time.offers(None, claim_time_result(gpus, profiles))


@pytest.fixture(autouse=True)
def no_sysfs(monkeypatch):
    monkeypatch.setattr(claim_time.dra_devices, "pcie_root", lambda sysfs, address: "pci0000:%s" % address[5:7])
    monkeypatch.setattr(claim_time.dra_devices, "numa_node", lambda sysfs, address: 0)


def strict(body):
    for version in ("1.36.0", "1.37.0"):
        kubernetes_validate.validate(body, version, strict=True)


@pytest.mark.parametrize("gpus, counter_slices, device_slices", [
    (1, [1], [5]), (8, [8], [40]), (9, [8, 1], [45]), (13, [8, 5], [64, 1])])
def test_counter_sets_and_devices_live_in_separate_slices_within_the_limits(gpus, counter_slices, device_slices):
    result = slices.desired_slices(NODE, offers(gpus), 2)
    counters = [item["spec"]["sharedCounters"] for item in result if "sharedCounters" in item["spec"]]
    devices = [item["spec"]["devices"] for item in result if "devices" in item["spec"]]
    assert [len(c) for c in counters] == counter_slices and [len(d) for d in devices] == device_slices
    assert all(("sharedCounters" in item["spec"]) != ("devices" in item["spec"]) for item in result)
    assert {item["spec"]["pool"]["resourceSliceCount"] for item in result} == {len(result)}
    names = [s["name"] for c in counters for s in c]
    assert len(set(names)) == gpus and all(len(s["counters"]) <= 32 for c in counters for s in c)
    for item in result:
        strict(item)


def test_a_profile_device_is_multi_allocatable_charges_the_gpu_counter_and_has_no_pci_bus_id():
    result = slices.desired_slices(NODE, offers(1), 1)
    [sets] = [item["spec"]["sharedCounters"] for item in result if "sharedCounters" in item["spec"]]
    assert sets == [{"name": "gpu-0000-41-00-0", "counters": {"gpu": {"value": "1"}}}]
    [devices] = [item["spec"]["devices"] for item in result if "devices" in item["spec"]]
    by_name = {d["name"]: d for d in devices}
    device = by_name["l40s-24q-gpu-0000-41-00-0"]
    assert device["allowMultipleAllocations"] is True
    assert device["consumesCounters"] == [{"counterSet": "gpu-0000-41-00-0", "counters": {"gpu": {"value": "1"}}}]
    assert device["capacity"] == {"instances": {"value": "2", "requestPolicy": {"default": "1", "validValues": ["1"]}}}
    assert by_name["l40s-48q-gpu-0000-41-00-0"]["capacity"]["instances"]["value"] == "1"
    attrs = device["attributes"]
    assert "resource.kubernetes.io/pciBusID" not in attrs
    assert (attrs["profile"], attrs["framebuffer"], attrs["series"], attrs["parentGPU"], attrs["claimTime"]) == (
        {"string": "L40S-24Q"}, {"int": 24576}, {"string": "Q"}, {"string": "0000:41:00.0"}, {"bool": True})
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:41"}
    assert all(len(d["attributes"]) + len(d["capacity"]) <= 32 for d in devices)


def test_fixed_and_claim_time_devices_share_the_pool_and_a_change_bumps_the_generation():
    first = slices.plan(NODE, offers(1), [])
    existing = [dict(body, metadata=dict(body["metadata"], resourceVersion="1")) for body in first.creates]
    again = slices.plan(NODE, offers(1), existing)
    assert again.empty
    grown = slices.plan(NODE, offers(2), existing)
    assert {body["spec"]["pool"]["generation"] for body in grown.updates + grown.creates} == {2}


def readme_claim_time_objects():
    text = (pathlib.Path(__file__).resolve().parents[6] / "README.md").read_text()
    section = text.split("\n### Profiles chosen at claim time", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return [doc for block in re.findall(r"```yaml\n(.*?)```", section, re.S) for doc in yaml.safe_load_all(block)]


def test_the_readme_config_declares_gpu_1_and_its_templates_select_the_claim_time_devices():
    config, *templates = readme_claim_time_objects()
    assert [e.devices for e in declaration(config, "README").entries] == [(1,)]
    assert [e.profiles for e in vgpu_layout.from_document(config, "default")] == [{"L40S-24Q": 2}]
    devices = [d for item in slices.desired_slices(NODE, offers(1), 1) for d in item["spec"].get("devices") or ()]
    expected = {"l40s-12q": ["l40s-12q-gpu-0000-41-00-0"],
                "l40s-24q-else-12q": ["l40s-24q-gpu-0000-41-00-0", "l40s-12q-gpu-0000-41-00-0"]}
    for template in templates:
        assert template["kind"] == "ResourceClaimTemplate"
        strict(template)
        [request] = template["spec"]["spec"]["devices"]["requests"]
        choices = request.get("firstAvailable") or [request["exactly"]]
        got = [selected([s["cel"]["expression"] for s in choice["selectors"]], claim_time.dra_devices.DRIVER, devices)
               for choice in choices]
        assert [name for names in got for name in names] == expected[template["metadata"]["name"]]
