"""node/engine/vgpu_writer.py: the one writer of a VF's type re-checks, ignores exactly the holders it acts for, reads back
and holds the node lock for the write."""

import fcntl
import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import node_lock
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_writer
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

VF = "0000:41:00.4"
MINE, OTHER = "DRA claim ns/mine (prepared)", "DRA claim ns/other (prepared)"


class StuckSysfs(Sysfs):
    """A driver that accepts a write and keeps the old type (what the read-back is for)."""

    def write(self, rel, value):
        self.writes += 1


@pytest.fixture
def sysfs(tmp_path):
    directory = tmp_path / "bus" / "pci" / "devices" / VF / "nvidia"
    directory.mkdir(parents=True)
    (directory / "current_vgpu_type").write_text("0\n")
    return Sysfs(str(tmp_path))


def current(sysfs):
    with open(os.path.join(sysfs.root, vgpu_writer.type_path(VF))) as handle:
        return handle.read().strip()


def test_the_recheck_ignores_exactly_the_holder_acted_for(sysfs):
    holders = {VF: [MINE]}
    writer = vgpu_writer.VgpuWriter(sysfs, lambda names: {n: holders.get(n, []) for n in names})
    writer.set_type(VF, 1155, acting_for=(MINE,))
    assert current(sysfs) == "1155"
    holders[VF] = [MINE, OTHER]
    with pytest.raises(vgpu_writer.VgpuHeld) as caught:
        writer.clear_type(VF, acting_for=(MINE,))
    assert caught.value.holders == [MINE, OTHER] and OTHER in str(caught.value) and VF in str(caught.value)
    assert current(sysfs) == "1155" and sysfs.writes == 1
    with pytest.raises(vgpu_writer.VgpuHeld):
        writer.clear_type(VF)     # acting for nobody: its own claim holds it too
    assert current(sysfs) == "1155"


def test_a_write_that_does_not_read_back_names_vf_and_type(tmp_path, sysfs):
    stuck = StuckSysfs(sysfs.root)
    with pytest.raises(vgpu_writer.VgpuWriteError, match="VF %s: wrote type 1155, it reads back 0" % VF):
        vgpu_writer.VgpuWriter(stuck, None).set_type(VF, 1155)


def test_the_write_is_made_under_the_node_lock(sysfs, tmp_path):
    seen = []

    class Watching(Sysfs):
        def write(self, rel, value):
            seen.append(node_lock.held_here(self.root))
            super().write(rel, value)
    watching = Watching(sysfs.root)
    vgpu_writer.VgpuWriter(watching, None).set_type(VF, 7)         # taken for the write, given back after
    assert seen == [True] and not node_lock.held_here(sysfs.root)
    with node_lock.node_lock(sysfs.root, 5):                         # the caller's is used, not taken twice
        vgpu_writer.VgpuWriter(watching, None, lock_wait=0.1).clear_type(VF)
    assert seen == [True, True] and current(sysfs) == "0"


def test_a_node_lock_held_elsewhere_is_a_write_error_and_nothing_is_written(sysfs):
    # another apply holds the node lock: a flock of its own open file (not this process's NodeLock)
    handle = os.open(node_lock.lock_path(sysfs.root), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with pytest.raises(vgpu_writer.VgpuWriteError, match="%s not written: another accelops-vgpu apply" % VF):
            vgpu_writer.VgpuWriter(sysfs, None, lock_wait=0.2).set_type(VF, 7)
        assert current(sysfs) == "0" and sysfs.writes == 0
    finally:
        os.close(handle)


def test_attempt_tells_a_refusal_in_the_callers_words_without_the_holders_it_acts_for(sysfs):
    holders = {VF: [MINE, OTHER]}
    writer = vgpu_writer.VgpuWriter(sysfs, lambda names: {n: holders.get(n, []) for n in names})
    assert vgpu_writer.attempt(lambda: writer.set_type(VF, 1155, acting_for=(MINE,)),
                               held=lambda who: "kept: held by %s" % who, acting_for=(MINE,)) == \
        "kept: held by %s" % OTHER
    with pytest.raises(KeyError, match="held by"):      # an exception the caller's words return is raised
        vgpu_writer.attempt(lambda: writer.set_type(VF, 1155), held=lambda who: KeyError("held by %s" % who))
    with pytest.raises(ValueError, match="held by"):    # no `held`: a refusal is one more write error
        vgpu_writer.attempt(lambda: writer.set_type(VF, 1155), failed=lambda exc: ValueError(str(exc)))
    with pytest.raises(vgpu_writer.VgpuHeld):            # no words for it: the writer's own error
        vgpu_writer.attempt(lambda: writer.set_type(VF, 1155), failed=None)
    holders.clear()
    assert vgpu_writer.attempt(lambda: writer.set_type(VF, 1155), held=lambda who: "kept") is None
    assert current(sysfs) == "1155"
