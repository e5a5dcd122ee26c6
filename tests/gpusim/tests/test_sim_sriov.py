"""SR-IOV as kernel drivers/pci/iov.c does it: errno values, links, VF addresses."""

from __future__ import annotations

import errno
import os
import threading
import time

from simhelpers import enable_vfs, read, rebind, write, write_fails


def test_nvidia_pf_without_sriov_configure_refuses_with_enoent(gpusim_node):
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    write_fails(node.device_path(pf, "sriov_numvfs"), "4", errno.ENOENT)
    assert read(node.device_path(pf, "sriov_numvfs")) == "0"
    write(node.device_path(pf, "sriov_numvfs"), "0")        # the current value always succeeds


def test_numvfs_rules_on_a_pf_with_sriov_configure(gpusim_node):
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    numvfs = node.device_path(pf, "sriov_numvfs")
    rebind(node, pf, "nvidia", "pci-pf-stub")   # has sriov_configure, as sriov-manage does
    write_fails(numvfs, "33", errno.ERANGE)
    write_fails(numvfs, "four", errno.EINVAL)
    write_fails(numvfs, "-1", errno.EINVAL)
    write(numvfs, "4\n")
    assert read(numvfs) == "4"
    write(numvfs, "4")                                       # same value: success, no change
    write_fails(numvfs, "8", errno.EBUSY)
    write(numvfs, "0")
    assert node.vfs(pf) == []
    write(numvfs, "0x8")                                     # kstrtou16 base 0
    assert len(node.vfs(pf)) == 8


def test_no_driver_bound_gives_enoent(gpusim_node):
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    write(node.path("bus/pci/drivers/nvidia/unbind"), pf)
    assert not os.path.exists(node.device_path(pf, "driver"))
    write_fails(node.device_path(pf, "sriov_numvfs"), "2", errno.ENOENT)


def test_read_only_attributes_refuse_writes_with_eacces(gpusim_node):
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    for name in ("sriov_totalvfs", "sriov_offset", "sriov_stride", "sriov_vf_device", "vendor", "class"):
        write_fails(node.device_path(pf, name), "1", errno.EACCES)
    assert node.log()[-1] == {"seq": 6, "path": "bus/pci/devices/%s/class" % pf, "value": None,
                              "result": "error", "errno": "EACCES"}


def test_l40s_vfs_start_at_function_4_with_links(gpusim_node):
    node = gpusim_node("l40s:2")
    pf = node.pfs()[1]
    assert pf == "0000:42:00.0"
    rebind(node, pf, "nvidia", "pci-pf-stub")   # has sriov_configure, as sriov-manage does
    write(node.device_path(pf, "sriov_numvfs"), "32")
    vfs = node.vfs(pf)
    assert vfs[:5] == ["0000:42:00.4", "0000:42:00.5", "0000:42:00.6", "0000:42:00.7", "0000:42:01.0"]
    assert vfs[-1] == "0000:42:04.3"
    vf = node.device_path(vfs[0])
    assert os.path.realpath(os.path.join(vf, "physfn")) == os.path.realpath(node.device_path(pf))
    assert os.readlink(os.path.join(vf, "iommu_group")) == "../../../kernel/iommu_groups/200"
    assert os.path.basename(os.readlink(os.path.join(vf, "driver"))) == "nvidia"
    assert read(os.path.join(vf, "device")) == "0x26b9" and read(os.path.join(vf, "class")) == "0x030200"
    assert "PCI_ID=10DE:26B9" in read(os.path.join(vf, "uevent")).splitlines()
    assert os.listdir(os.path.join(vf, "vfio-dev")) == ["vfio100"]
    assert os.path.exists(node.path(".gpusim/dev/vfio/200"))
    assert os.path.exists(node.path(".gpusim/dev/vfio/devices/vfio100"))
    assert not os.path.exists(node.device_path(pf, "nvidia"))
    for name, value in [("sriov_totalvfs", "32"), ("sriov_offset", "4"), ("sriov_stride", "1"),
                        ("sriov_vf_device", "26b9"), ("sriov_drivers_autoprobe", "1")]:
        assert read(node.device_path(pf, name)) == value


def test_generic_nic_path_enables_directly(gpusim_node):
    node = gpusim_node("nic:1")
    pf = node.pfs()[0]
    assert read(node.device_path(pf, "class")) == "0x020000"
    assert os.path.basename(os.readlink(node.device_path(pf, "driver"))) == "i40e"
    write(node.device_path(pf, "sriov_numvfs"), "3")
    vfs = node.vfs(pf)
    assert vfs == ["0000:41:02.0", "0000:41:02.1", "0000:41:02.2"]   # offset 16, stride 1
    assert read(node.device_path(vfs[0], "device")) == "0x154c"
    assert os.path.basename(os.readlink(node.device_path(vfs[0], "driver"))) == "iavf"
    write_fails(node.device_path(pf, "sriov_numvfs"), "65", errno.ERANGE)


def test_autoprobe_off_leaves_vfs_unbound(gpusim_node):
    node = gpusim_node("nic:1")
    pf = node.pfs()[0]
    write_fails(node.device_path(pf, "sriov_drivers_autoprobe"), "maybe", errno.EINVAL)
    write(node.device_path(pf, "sriov_drivers_autoprobe"), "0")
    write(node.device_path(pf, "sriov_numvfs"), "1")
    assert not os.path.exists(node.device_path(node.vfs(pf)[0], "driver"))


def test_non_sriov_devices_have_no_sriov_files(gpusim_node):
    node = gpusim_node("t4:1,nvme:1")
    for pf in node.pfs():
        assert not os.path.exists(node.device_path(pf, "sriov_numvfs"))
    assert read(node.device_path(node.pfs("nvme")[0], "class")) == "0x010802"


def test_every_link_in_a_busy_tree_resolves(gpusim_node):
    node = gpusim_node("l40s:1,a2:1,t4:1,nic:1,nvme:1")
    l40s, a2, t4, nic, dummy = node.pfs()
    for pf in (l40s, a2):                               # two VFs each keep the walk short
        rebind(node, pf, "nvidia", "pci-pf-stub")
        write(node.device_path(pf, "sriov_numvfs"), "2")
        rebind(node, pf, "pci-pf-stub", "nvidia")
    write(node.device_path(nic, "sriov_numvfs"), "2")
    write(node.path("class/mdev_bus", t4, "mdev_supported_types/nvidia-230/create"),
          "11111111-2222-4333-8444-555555555555")
    a2_vf = node.vfs(a2)[0]
    write(node.path("class/mdev_bus", a2_vf, "mdev_supported_types/nvidia-746/create"),
          "11111111-2222-4333-8444-666666666666")
    links = []
    for folder, dirs, files in os.walk(node.root):
        links += [os.path.join(folder, name) for name in dirs + files if os.path.islink(os.path.join(folder, name))]
    assert len(links) > 60
    assert [link for link in links if not os.path.exists(link)] == []
    t4_mdev, a2_mdev = "11111111-2222-4333-8444-555555555555", "11111111-2222-4333-8444-666666666666"
    assert sorted(os.listdir(node.path("bus/mdev/devices"))) == [t4_mdev, a2_mdev]
    parent = os.path.realpath(node.path("bus/mdev/devices", a2_mdev, ".."))
    assert parent == os.path.realpath(node.device_path(a2_vf))


def test_driver_binding_rules(gpusim_node):
    node = gpusim_node("l40s:1,nic:1")
    l40s, nic = node.pfs()
    write(node.device_path(nic, "sriov_numvfs"), "1")
    nic_vf = node.vfs(nic)[0]
    write_fails(node.path("bus/pci/drivers/nvidia/bind"), l40s, errno.EBUSY)          # already bound
    write_fails(node.path("bus/pci/drivers/vfio-pci/unbind"), l40s, errno.ENODEV)     # not its driver
    write(node.path("bus/pci/drivers/iavf/unbind"), nic_vf)
    write_fails(node.path("bus/pci/drivers/vfio-pci/bind"), nic_vf, errno.ENODEV)     # no ID match
    write(node.device_path(nic_vf, "driver_override"), "vfio-pci")
    assert read(node.device_path(nic_vf, "driver_override")) == "vfio-pci"
    write(node.path("bus/pci/drivers/vfio-pci/bind"), nic_vf)
    vfio = os.listdir(node.device_path(nic_vf, "vfio-dev"))
    assert vfio == ["vfio%d" % (200 - 100)] and os.path.exists(node.path(".gpusim/dev/vfio/devices", vfio[0]))
    l40s_vf = enable_vfs(node, l40s)[0]
    write(node.path("bus/pci/drivers/nvidia/unbind"), l40s_vf)
    assert not os.path.exists(node.device_path(l40s_vf, "nvidia"))
    write(node.device_path(l40s_vf, "driver_override"), "vfio-pci")
    write_fails(node.path("bus/pci/drivers/vfio-pci/bind"), l40s_vf, errno.EINVAL)   # kubevirt#17642


def timed_write(path, value):
    """(seconds, errno or None) of one write."""
    started = time.monotonic()
    try:
        write(path, value)
    except OSError as exc:
        return time.monotonic() - started, exc.errno
    return time.monotonic() - started, None


def test_disabling_or_unbinding_under_a_vm_blocks_until_it_lets_go(gpusim_node):
    """drivers/vfio/vfio_main.c vfio_unregister_group_dev(): the writer waits for the VM, then goes on."""
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    vf = enable_vfs(node, pf)[0]
    node.hold(vf)
    releaser = threading.Timer(1.0, node.release, [vf])
    releaser.start()
    took, error = timed_write(node.path("bus/pci/drivers/nvidia/unbind"), pf)   # nvidia takes its VFs along
    releaser.join()
    assert error is None and took >= 0.9 and node.vfs(pf) == []
    write(node.device_path(pf, "driver_override"), "pci-pf-stub")
    write(node.path("bus/pci/drivers/pci-pf-stub/bind"), pf)
    write(node.device_path(pf, "sriov_numvfs"), "4")
    vf = node.vfs(pf)[0]
    node.hold(vf)
    releaser = threading.Timer(1.0, node.release, [vf])
    releaser.start()
    took, error = timed_write(node.device_path(pf, "sriov_numvfs"), "0")
    releaser.join()
    assert error is None and took >= 0.9 and node.vfs(pf) == []
    assert [e["result"] for e in node.log() if e["path"].endswith(pf + "/sriov_numvfs")][-1] == "ok"


def test_a_vm_that_never_lets_go_blocks_for_the_timeout_then_etimedout(gpusim_node):
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    vf = enable_vfs(node, pf)[0]
    node.hold(vf)
    node.ctl("block-timeout", "0.5")
    took, error = timed_write(node.path("bus/pci/drivers/nvidia/unbind"), vf)
    assert error == errno.ETIMEDOUT and 0.45 <= took < 5, (took, error)
    took, error = timed_write(node.path("bus/pci/drivers/nvidia/unbind"), pf)   # its VF is held
    assert error == errno.ETIMEDOUT and 0.45 <= took < 5, (took, error)
    assert node.vfs(pf)[0] == vf and list(node.state()["held"]) == [vf]   # nothing changed
    assert [e["errno"] for e in node.log()[-2:]] == ["ETIMEDOUT", "ETIMEDOUT"]
    node.release(vf)
    took, error = timed_write(node.path("bus/pci/drivers/nvidia/unbind"), vf)
    assert error is None and took < 0.45
