"""Names for the core (issue 41.3): one class name per meaning across module_utils, and the DRA driver's prepared
devices carry their fields by name (claims.PreparedDevice), not by index."""

import ast
import os

from ansible_collections.accelops.vgpu.plugins.module_utils import errors
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claims, driver, metadata
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DraDevice

MODULE_UTILS = os.path.dirname(errors.__file__)


def class_names(root):
    """{class name: [file]} of every class defined below `root` (generated gRPC modules aside)."""
    found = {}
    for directory, dummy, files in os.walk(root):
        for name in files:
            if name.endswith(".py") and not name.endswith(("_pb2.py", "_pb2_grpc.py")):
                path = os.path.join(directory, name)
                with open(path) as handle:
                    tree = ast.parse(handle.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        found.setdefault(node.name, []).append(os.path.relpath(path, root))
    return found


def test_no_two_classes_of_module_utils_share_a_name():
    assert {name: files for name, files in class_names(MODULE_UTILS).items() if len(files) > 1} == {}


def test_the_scan_sees_a_shared_name(tmp_path):
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "m.py").write_text("class VgpuDevice:\n    pass\n")
    assert {name: sorted(files) for name, files in class_names(str(tmp_path)).items()} == {
        "VgpuDevice": ["a/m.py", "b/m.py"]}


def test_a_prepared_device_is_recorded_and_described_by_its_fields():
    device = DraDevice(name="l40s-24q-0000-41-00-4", framework="vendor-vfio", address="0000:41:00.4",
                       parent_gpu="0000:41:00.0", profile="L40S-24Q", type_name="NVIDIA L40S-24Q", type_id=1155)
    entry = claims.PreparedDevice("gpu/large", "node-1/vgpu.accelops.io", device)
    assert driver._record([entry], [device]) == [{   # pylint: disable=protected-access
        "requests": ["gpu/large"], "pool": "node-1/vgpu.accelops.io", "device": device.name, "key": "0000:41:00.4",
        "typeID": 1155, "cdiIDs": [], "claimTime": True}]
    ref = claims.ClaimRef("ns", "claim", "uid-1")
    body = metadata.document(ref, "gpu", [entry], "vgpu.accelops.io")[0]
    assert body["requests"][0]["devices"][0]["pool"] == "node-1/vgpu.accelops.io"
    assert body["requests"][0]["devices"][0]["name"] == device.name
