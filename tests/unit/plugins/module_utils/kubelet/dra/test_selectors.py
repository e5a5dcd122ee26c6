"""The README's claim template and the role's DeviceClasses select exactly the intended published devices."""

import pathlib
import re
import subprocess

import yaml
from cel_devices import selected
from schemas import assert_valid

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import slices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DRIVER, DraDevice

ROOT = pathlib.Path(__file__).resolve().parents[6]


def device(profile, address, type_id, framework="vendor-vfio", uuid=None, gpu="0000:41:00.0"):
    return DraDevice(name="%s-%s" % (profile.lower(), (uuid or address).replace(":", "-").replace(".", "-")),
                     framework=framework, address=address, parent_gpu=gpu, profile=profile,
                     type_name="NVIDIA " + profile, type_id=type_id, mdev_uuid=uuid, pcie_root="pci0000:40",
                     product="L40S" if profile.startswith("L40S") else "A2/A16", framebuffer_mib=1024)


# one node: L40S-24Q and L40S-12Q on two L40S (profiles mix on one model), an A16 with mdevs
DEVICES = [device("L40S-24Q", "0000:41:00.4", 1155), device("L40S-24Q", "0000:41:00.5", 1155),
           device("L40S-12Q", "0000:42:00.4", 1154, gpu="0000:42:00.0"),
           device("A16-2Q", "0000:51:00.4", 700, "mdev", "5c8f3b52-0c1c-4a4b-9f5e-0000000000aa", "0000:51:00.0")]
PUBLISHED = slices.desired_slices("gpu-a", DEVICES, 1)[0]["spec"]["devices"]


def readme_objects():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Claiming vGPUs with DRA", 1)[1].split("\n## ", 1)[0]
    section = section.split("\n### Profiles chosen at claim time", 1)[0]   # its own test: test_claim_time.py
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S)]


def device_classes():
    """The DeviceClasses the agent's chart creates with dra.enabled (rendered by the real helm of `make setup`)."""
    chart = ROOT / "charts" / "accelops-vgpu-node-agent"
    rendered = subprocess.run([str(ROOT / ".venv" / "bin" / "helm"), "template", "agent", str(chart), "--values",
                               str(chart / "ci" / "example-values.yaml"), "--set", "dra.enabled=true"],
                              capture_output=True, text=True, timeout=120, check=True).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o and o["kind"] == "DeviceClass"]
    return {c["metadata"]["name"]: [s["cel"]["expression"] for s in c["spec"]["selectors"]] for c in objects}, objects


def test_device_classes_are_valid_and_select_by_driver_and_framework():
    classes, objects = device_classes()
    for obj in objects:
        assert_valid(obj)
    assert selected(classes["vgpu.accelops.io"], DRIVER, PUBLISHED) == sorted(d.name for d in DEVICES)
    assert selected(classes["vendor-vfio.vgpu.accelops.io"], DRIVER, PUBLISHED) == sorted(
        d.name for d in DEVICES if d.framework == "vendor-vfio")
    assert selected(classes["mdev.vgpu.accelops.io"], DRIVER, PUBLISHED) == [DEVICES[3].name]
    assert selected(classes["vgpu.accelops.io"], "gpu.nvidia.com", PUBLISHED) == []   # another driver's devices


def test_the_readme_claim_template_selects_exactly_the_l40s_24q_vgpus():
    objects = readme_objects()
    template = next(o for o in objects if o["kind"] == "ResourceClaimTemplate")
    assert_valid(template)
    [request] = template["spec"]["spec"]["devices"]["requests"]
    classes, dummy = device_classes()
    expressions = classes[request["exactly"]["deviceClassName"]] + [
        s["cel"]["expression"] for s in request["exactly"]["selectors"]]
    assert selected(expressions, DRIVER, PUBLISHED) == ["l40s-24q-0000-41-00-4", "l40s-24q-0000-41-00-5"]


def test_the_readme_vmi_names_the_claim_and_request_of_the_template():
    objects = readme_objects()
    template = next(o for o in objects if o["kind"] == "ResourceClaimTemplate")
    vmi = next(o for o in objects if o["kind"] == "VirtualMachineInstance")
    [claim] = vmi["spec"]["resourceClaims"]
    [gpu] = vmi["spec"]["domain"]["devices"]["gpus"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    assert (gpu["claimName"], gpu["requestName"]) == (claim["name"], template["spec"]["spec"]["devices"]["requests"][0]["name"])
    assert "deviceName" not in gpu      # a DRA GPU in KubeVirt: claimName/requestName, no deviceName
