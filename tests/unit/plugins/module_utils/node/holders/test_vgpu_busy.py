import errno

import pytest

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import vgpu_busy
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs, SysfsError

PF, NIC = "0000:41:00.0", "0000:81:00.0"


def users(node):
    return vgpu_busy.users(Sysfs(str(node.sys)), str(node.dev), str(node.proc))


def test_nothing_in_use(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(PF, total=2)
    node.set_numvfs(PF, 2)
    (node.proc / "modules").write_text("nvidia_vgpu_vfio 61440 0 - Live 0x0\nnvidia 1 1 nvidia_vgpu_vfio, Live 0x0\n")
    assert users(node) == []


def test_held_nvidia_vf_and_mdev_are_named_a_nic_vf_is_not(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(PF, total=2)
    node.set_numvfs(PF, 2)
    node.nic(NIC, total=1)
    node.set_numvfs(NIC, 1)
    vf_pid = node.hold(node.group_of("0000:41:00.5"))
    node.hold(node.group_of("0000:81:00.4"))
    assert users(node) == ["0000:41:00.5 held by pid %d" % vf_pid]


def test_a_vf_a_prepared_dra_claim_uses_is_in_use(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(PF, total=2)
    node.set_numvfs(PF, 2)

    def claims():   # a holder source, as node/holders/claim_holders.holders_source gives one
        return {"0000:41:00.4": ["DRA claim vms/vm-a-gpu"]}

    assert vgpu_busy.users(Sysfs(str(node.sys)), str(node.dev), str(node.proc), (claims,)) == [
        "0000:41:00.4 held by DRA claim vms/vm-a-gpu"]


def test_held_mdev_names_its_parent(tmp_path):
    node = FakeNode(tmp_path)
    node.mdev_gpu(PF, total=1)
    uuid = "5c8f3b52-0c1c-4a4b-9f5e-111111111111"
    node.mdev(uuid, "0000:41:00.4")
    pid = node.hold(node.group_of(uuid, "bus/mdev/devices"))
    assert users(node) == ["mdev %s on 0000:41:00.4 held by pid %d" % (uuid, pid)]


def test_vfio_module_users_count(tmp_path):
    node = FakeNode(tmp_path)
    (node.proc / "modules").write_text("nvidia_vgpu_vfio 61440 3 - Live 0x0\n")
    assert users(node) == ["module nvidia_vgpu_vfio has 3 user(s)"]
    assert vgpu_busy.module_use_count(str(node.proc), "nvidia") is None


class FailingSysfs(Sysfs):
    """sysfs whose reads of paths ending in `failing` fail with `code` (a kernfs show() returning -EIO, a device
    going away: ENODEV, an LSM: EACCES)."""

    def __init__(self, root, failing, code):
        super().__init__(root)
        self.failing, self.code = failing, code

    def read(self, rel):
        if rel.endswith(self.failing):
            raise SysfsError(rel, self.code)
        return super().read(rel)


@pytest.mark.parametrize("code", [errno.EIO, errno.EACCES, errno.ENODEV, errno.EINVAL, errno.ENOENT])
def test_a_held_vf_whose_vendor_cannot_be_read_is_still_in_use(tmp_path, code):
    """32.6: an unreadable in-use fact is unknown, and unknown is held (only a vendor read as another's is skipped)."""
    node = FakeNode(tmp_path)
    node.pf(PF, total=2)
    node.set_numvfs(PF, 2)
    pid = node.hold(node.group_of("0000:41:00.5"))
    sysfs = FailingSysfs(str(node.sys), "0000:41:00.5/vendor", code)
    assert vgpu_busy.users(sysfs, str(node.dev), str(node.proc)) == ["0000:41:00.5 held by pid %d" % pid]
