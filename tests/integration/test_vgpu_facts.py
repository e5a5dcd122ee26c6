"""accelops.vgpu.vgpu_facts on a programmed simulated node, and on a plain copy of its sysfs."""

import subprocess

UUID = "7f2c4b1e-8d3a-4c55-9e61-3a2b1c0d9e8f"


def programmed_node(gpusim_node, mdev_on="a2"):
    """L40S with a typed VF that a VM holds, a T4, a NIC, and an mdev on the first VF of an A2
    (mdev_on="a2") or on the T4 itself (mdev_on="t4", a smaller node: the copy test reads it all)."""
    node = gpusim_node("l40s:1,t4:1,nic:1" + (",a2:1" if mdev_on == "a2" else ""))
    for pf in node.pfs("l40s") + node.pfs("a2"):
        subprocess.run(["sriov-manage", "-e", pf], env=node.env, check=True, capture_output=True)
    typed = node.vfs(node.pfs("l40s")[0])[1]
    parent, mdev_type = (node.vfs(node.pfs("a2")[0])[0], "nvidia-742") if mdev_on == "a2" else \
        (node.pfs("t4")[0], "nvidia-222")
    node.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % typed, 1155)
    node.write("class/mdev_bus/%s/mdev_supported_types/%s/create" % (parent, mdev_type), UUID)
    pid = node.hold(typed)
    node.clear_log()
    return node, typed, parent, pid


def facts_of(run):
    assert run.rc == 0, run
    return run.task("facts")["ansible_facts"]["vgpu"]


def by_address(items):
    return dict((item["address"], item) for item in items)


def test_facts_of_a_programmed_node_in_check_mode(gpusim_node, run_playbook):
    node, typed, parent, pid = programmed_node(gpusim_node)
    run = run_playbook([{"name": "facts", "accelops.vgpu.vgpu_facts": {}},
                        {"name": "facts are host facts", "ansible.builtin.assert": {
                            "that": ["ansible_facts.vgpu.gpus | length == 3"]}}], node, check=True)
    found = facts_of(run)
    assert not run.task("facts")["changed"] and not run.task("facts are host facts").get("failed")
    gpus = by_address(found["gpus"])
    l40s, a2, t4 = node.pfs("l40s")[0], node.pfs("a2")[0], node.pfs("t4")[0]
    assert sorted(gpus) == sorted([l40s, a2, t4])          # the NIC is no GPU
    assert [(gpus[a]["model"], gpus[a]["framework"], gpus[a]["sriov_numvfs"]) for a in (l40s, a2, t4)] == \
        [("L40S", "vendor-vfio", 32), ("A2/A16", "mdev", 16), ("T4", "mdev", 0)]
    assert gpus[l40s]["pci_id"] == "10de:26b9" and gpus[l40s]["vfs"] == node.vfs(l40s)
    assert "GRID T4-1B" in [t["name"] for t in gpus[t4]["mdev_types"]]

    vfs = by_address(found["vfs"])
    assert len(vfs) == 48
    assert (vfs[typed]["vgpu_type_id"], vfs[typed]["vgpu_type"]) == (1155, "NVIDIA L40S-24Q")
    assert (vfs[typed]["held"], vfs[typed]["holders"]) == (True, [pid])
    assert [vf for vf in vfs.values() if vf["held"]] == [vfs[typed]]
    assert vfs[parent]["mdevs"] == [UUID] and vfs[parent]["vgpu_type_id"] is None
    assert found["mdevs"] == [{"uuid": UUID, "parent": parent, "type": "nvidia-742", "type_name": "NVIDIA A2-1B",
                               "iommu_group": found["mdevs"][0]["iommu_group"], "held": False, "holders": []}]
    assert found["mdevs"][0]["iommu_group"] is not None
    assert node.log() == []


def test_a_plain_copy_of_the_sysfs_reports_the_same_except_holders(gpusim_node, run_playbook, tmp_path):
    node, typed, dummy, dummy_pid = programmed_node(gpusim_node, mdev_on="t4")
    copy = tmp_path / "sys-copy"
    # like copying a real host's /sys: write-only attributes cannot be read and stay behind
    subprocess.run(["cp", "-a", node.root, str(copy)], capture_output=True, check=False)
    (tmp_path / "empty-dev").mkdir()  # a /dev without VFIO nodes
    of_copy = {"sysfs_root": str(copy), "dev_root": str(tmp_path / "empty-dev")}
    run = run_playbook([{"name": "facts", "accelops.vgpu.vgpu_facts": {}},
                        {"name": "copy", "accelops.vgpu.vgpu_facts": of_copy}], node)
    live = facts_of(run)
    copied = run.task("copy")["ansible_facts"]["vgpu"]
    # no process has a copied node open; where some process could not be inspected (PID 1 on these
    # hosts) and no node can be probed, every VFIO device is "unknown", i.e. held (fail closed)
    for device in copied["vfs"] + copied["mdevs"]:
        assert all(isinstance(h, str) and h.startswith("unknown:") for h in device["holders"]), device
        assert device["held"] == bool(device["holders"])
    assert [m["uuid"] for m in copied["mdevs"]] == [UUID] and copied["mdevs"][0]["type_name"] == "GRID T4-1B"
    for device in live["vfs"] + copied["vfs"] + live["mdevs"] + copied["mdevs"] + live["gpus"] + copied["gpus"]:
        device.update(held=None, holders=None)
    assert copied == live
