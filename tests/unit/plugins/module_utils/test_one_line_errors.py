"""Every EngineError is one line: user input with newlines is quoted at the source (shown(), %r),
regexes do not let a final newline through, and the glue escapes whatever still slipped through."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster import gpu_operator, kubevirt

from ansible_collections.accelops.vgpu.plugins.module_utils.node import module_glue
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import sriov
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout as vl
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, one_line, shown
from ansible_collections.accelops.vgpu.tests.unit.plugins.module_utils.node.test_module_glue import Exited, FakeModule

ENTRY = [{"devices": "all", "vgpu-devices": {"L40S-24Q": 1}}]


def vdm(**configs):
    return {"version": "v1", "vgpu-configs": configs}


SOURCES = [
    (lambda: vl.from_vdm_config(dict(vdm(a=ENTRY), **{"bad\nkey": 1}), "a"), "'bad\\nkey'"),
    (lambda: vl.from_layout([{"profiles": {}, "evil\nkey": 1}]), "'evil\\nkey'"),
    (lambda: vl.from_vdm_config(vdm(**{"a\nb": ENTRY, "c": ENTRY})), "'a\\nb'"),
    (lambda: vl.from_vdm_config(vdm(**{"a\nb": ENTRY}), "x"), "'a\\nb'"),
    (lambda: vl.from_vdm_config(vdm(**{"a\nb": [{"devices": "all"}]}), "a\nb"), "vgpu-configs.'a\\nb'[0]"),
    (lambda: vl.from_vdm_config(vdm(**{"a\nb": []}), "a\nb"), "vgpu-configs.'a\\nb' must"),
    (lambda: vl.from_layout([{"profiles": {"L40S-24Q\n": -1}}]), "count -1"),
    (lambda: vl.from_layout([{"profiles": {"L40S-24Q\nX": 1}}]), "is not a vGPU profile name"),
    (lambda: vgpu_types.parse_profile("L40S-24Q\nX"), "'L40S-24Q\\nX' is not a vGPU profile name"),
    (lambda: kubevirt.validate_entries(kubevirt.PCI, [{"resourceName": "a\nb"}], "present"), "'a\\nb'"),
    (lambda: kubevirt.validate_entries(kubevirt.PCI, [{"resourceName": "r", "pciVendorSelector": "10DE:26B9\n"}],
                                       "present"), "'10DE:26B9\\n' is not VVVV:DDDD"),
    (lambda: kubevirt.select_kubevirt([], "kv\n", "ns"), "KubeVirt ns/'kv\\n'"),
    (lambda: gpu_operator.validate_label("accelops.io/vgpu.profile.L40S-24Q", "2\n", "gpu\na"),
     "Node 'gpu\\na': label accelops.io/vgpu.profile.L40S-24Q value '2\\n'"),
    (lambda: gpu_operator.validate_label("accelops.io/x\n", "2", "gpu-a"), "label key"),
    (lambda: gpu_operator.validate_vgpu_manager_version("580\n.82-ubuntu22.04"), "'580\\n.82-ubuntu22.04'"),
    (lambda: sriov.parse_num_vfs("4\n4"), "num_vfs '4\\n4'"),
]


@pytest.mark.parametrize("call,quoted", SOURCES)
def test_input_with_newlines_makes_a_one_line_error_that_quotes_it(call, quoted):
    with pytest.raises(EngineError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message and message == one_line(message) and quoted in message


def test_shown_quotes_only_what_does_not_print_on_one_line():
    assert shown("gpu-a") == "gpu-a" and shown(7) == "7" and shown("a\tb") == "'a\\tb'"


def test_the_net_escapes_control_characters_and_keeps_the_rest():
    assert one_line("GPU x:\nsecond\tline\x1b[31m é") == "GPU x:\\nsecond\\tline\\x1b[31m é"


def test_module_glue_folds_a_multi_line_engine_error():
    module = FakeModule()
    with pytest.raises(Exited):
        with module_glue.engine_errors(module):
            raise EngineError("0000:41:00.0: broken\nsecond line")
    assert module.exited["msg"] == "0000:41:00.0: broken\\nsecond line"
