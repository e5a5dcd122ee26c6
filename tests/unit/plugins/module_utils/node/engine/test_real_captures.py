"""The engine's nvidia-smi parsers on what a real GPU printed (tests/gpusim/captures/README.md: an H100 80GB
HBM3, driver 580.159.04), not on text the simulator or a test wrote."""

import os
from collections import OrderedDict

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import mig, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import FunctionRunner

CAPTURES = os.path.join(os.path.dirname(__file__), *[os.pardir] * 5, "gpusim", "captures")
PF = "0000:00:06.0"


def capture(name):
    with open(os.path.join(CAPTURES, name)) as handle:
        return handle.read()


def test_gpu_instance_profiles_are_read_from_the_real_table():
    assert mig.parse_profiles(capture("nvidia-smi-mig-lgip-h100.txt")) == OrderedDict([
        (19, ("1g.10gb", 7, 7)), (20, ("1g.10gb+me", 1, 1)), (15, ("1g.20gb", 4, 4)), (14, ("2g.20gb", 3, 3)),
        (9, ("3g.40gb", 2, 2)), (5, ("4g.40gb", 1, 1)), (0, ("7g.80gb", 1, 1))])


def test_the_engines_hopper_geometry_matches_the_real_maxima():
    """HOPPER_GEOMETRY plans MIG layouts before MIG mode is on; its maxima are the real driver's."""
    real = mig.parse_profiles(capture("nvidia-smi-mig-lgip-h100.txt"))
    assert {profile: geometry[3] for profile, geometry in mig.HOPPER_GEOMETRY.items()} == \
        {profile: total for profile, (dummy, free, total) in real.items()}


def runner_printing(text):
    def run(argv):
        assert argv[1:] == ["-q", "-i", PF]
        return 0, text, ""
    runner = FunctionRunner(run)
    runner.which = lambda name: "/usr/bin/" + name
    return runner


def test_a_gpu_without_the_vgpu_manager_is_named_as_such():
    """The real -q of a GPU on the plain driver has no 'Heterogeneous Time-Slice Sizes' line; the error says why."""
    with pytest.raises(LayoutError) as raised:
        vgpu_apply.mixed_mode_supported(runner_printing(capture("nvidia-smi-q-h100-580.txt")), PF)
    assert str(raised.value) == ("GPU 0000:00:06.0: nvidia-smi -q says Virtualization Mode Pass-Through, not Host "
                                 "VGPU: the vGPU manager driver is not loaded for it (accelops.vgpu.vgpu_driver)")


def test_mig_mode_reads_the_real_current_line():
    text = capture("nvidia-smi-q-h100-580.txt")
    current = [line for line in text.splitlines() if line.strip().startswith("Current")][0]
    assert mig.parse_mode(current.partition(":")[2]) is False
