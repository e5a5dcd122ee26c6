"""VFIO device nodes as the kernel's VFIO core opens them (drivers/vfio/group.c, device_cdev.c).

- A group node opens once at a time: a second open fails with EBUSY (vfio_group_fops_open:
  `group->opened_file`), also while a device of the group is bound through its iommufd cdev
  (`group->cdev_device_open_cnt`; gpusim counts an open cdev as bound, as a VM's is).
- The iommufd cdev opens any number of times (vfio_device_fops_cdev_open; only the bind is exclusive).
- sysfs names each node's device number: class/vfio/<group>/dev, <device>/vfio-dev/vfio<N>/dev.
"""

from __future__ import annotations

import errno
import os

import pytest

from simhelpers import enable_vfs, read


def _open(path):
    return os.open(path, os.O_RDWR)


def test_a_group_node_opens_once_and_not_while_its_cdev_is_open(gpusim_node):
    node = gpusim_node("l40s:1")
    vf = enable_vfs(node, node.pfs()[0])[0]
    group = os.path.basename(os.readlink(node.device_path(vf, "iommu_group")))
    group_node = node.path(".gpusim/dev/vfio", group)
    cdev = node.path(".gpusim/dev/vfio/devices", os.listdir(node.device_path(vf, "vfio-dev"))[0])
    first = _open(group_node)
    with pytest.raises(OSError) as err:
        _open(group_node)
    assert err.value.errno == errno.EBUSY
    assert vf in node.state()["held"]
    os.close(first)
    held = [_open(cdev), _open(cdev)]             # the cdev is not exclusive
    with pytest.raises(OSError) as err:
        _open(group_node)
    assert err.value.errno == errno.EBUSY
    for handle in held:
        os.close(handle)


def test_sysfs_names_the_device_number_of_each_vfio_node(gpusim_node):
    node = gpusim_node("l40s:1")
    vf = enable_vfs(node, node.pfs()[0])[0]
    group = os.path.basename(os.readlink(node.device_path(vf, "iommu_group")))
    cdev = os.listdir(node.device_path(vf, "vfio-dev"))[0]
    assert read(node.path("class/vfio", group, "dev")) == "510:%s" % group
    assert read(node.device_path(vf, "vfio-dev", cdev, "dev")) == "511:%s" % cdev[len("vfio"):]


def test_a_pf_bound_to_vfio_pci_is_a_vfio_group_a_vm_can_hold(gpusim_node):
    """Whole-GPU passthrough: a PF moved to vfio-pci (driver_override + bind, as driverctl does) gets a
    VFIO group node and cdev; while a VM holds it, unbinding it blocks as in the kernel. A PF on nvidia
    has neither (nvidia's own VFIO is for its VFs)."""
    node = gpusim_node("l40s:2")
    kept, passed = node.pfs()
    node.bind(passed, "vfio-pci")
    assert os.path.basename(os.readlink(node.device_path(passed, "driver"))) == "vfio-pci"
    assert not os.path.exists(node.device_path(kept, "vfio-dev"))
    assert os.listdir(node.device_path(passed, "vfio-dev")) == ["vfio9901"]
    group = os.path.basename(os.readlink(node.device_path(passed, "iommu_group")))
    assert read(node.path("class/vfio", group, "dev")) == "510:%s" % group
    pid = node.hold(passed)
    assert pid and passed in node.state()["held"]
    with pytest.raises(OSError) as err:
        _open(node.path(".gpusim/dev/vfio", group))
    assert err.value.errno == errno.EBUSY
    node.ctl("block-timeout", "0.2")
    with pytest.raises(OSError) as err:
        node.write("bus/pci/drivers/vfio-pci/unbind", passed)
    assert err.value.errno == errno.ETIMEDOUT
    assert os.path.basename(os.readlink(node.device_path(passed, "driver"))) == "vfio-pci"
