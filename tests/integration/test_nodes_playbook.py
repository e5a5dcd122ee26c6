"""playbooks/nodes.yml itself against several gpusim hosts: the prerequisites play (the host driver, the sriov role)
runs only on the nodes that ask, and a node whose prerequisites fail leaves the others their layout."""

import os
import re
import shlex
import subprocess

import yaml

from gpusim.models import MODELS

# not imported from conftest: with the whole tree collected, `conftest` may name another directory's
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE_PLAYBOOK = os.path.join(REPO, ".venv", "bin", "ansible-playbook")
COLLECTIONS = os.path.join(REPO, ".build", "collections")
NODE_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.join(REPO, ".venv", "bin", "python")
NODES_YML = os.path.join(REPO, "playbooks", "nodes.yml")
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
L40S_24Q = next(t.type_id for t in MODELS["l40s"].types if t.short_name == "L40S-24Q")


def run_nodes_yml(nodes, workdir, host_vars):
    """nodes.yml on `nodes` (host node-<i>, each with its own gpusim root and tools through its interpreter
    wrapper) with extra host variables ({host: {var: value}}); (rc, {host: recap}, output)."""
    hosts = {}
    for index, node in enumerate(nodes, 1):
        host = "node-%d" % index
        wrapper = workdir / ("python-" + host)
        wrapper.write_text("#!/bin/bash\nexport GPUSIM_ROOT=%s\nexport PATH=%s\nexec %s \"$@\"\n"
                           % (shlex.quote(node.root), shlex.quote(node.env["PATH"]), shlex.quote(NODE_PYTHON)))
        os.chmod(wrapper, 0o755)
        hosts[host] = dict({"ansible_python_interpreter": str(wrapper), "sriov_sysfs_root": node.root,
                            "sriov_dev_root": node.dev_root, "vgpu_profiles_sysfs_root": node.root,
                            "vgpu_profiles_dev_root": node.dev_root,
                            "vgpu_profiles_install_root": str(workdir / ("root-" + host))}, **host_vars.get(host, {}))
    group_vars = {"ansible_connection": "local", "sriov_devices": ["all"], "vgpu_profiles_selected": "two",
                  "vgpu_profiles_configs": {"two": [{"devices": "all", "profiles": {"L40S-24Q": 2}}]},
                  "vgpu_profiles_manage_service": False}
    inventory = workdir / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"vgpu_nodes": {"hosts": hosts, "vars": group_vars}}}}))
    tmp = str(workdir / "ansible-tmp")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=COLLECTIONS,
               ANSIBLE_LOCAL_TEMP=tmp, ANSIBLE_REMOTE_TEMP=tmp, ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(inventory), "-f", "2", NODES_YML], capture_output=True,
                          text=True, env=env, cwd=str(workdir), timeout=600, check=False)
    recap = dict((m.group(1), {"ok": int(m.group(2)), "failed": int(m.group(5))}) for m in RECAP.finditer(proc.stdout))
    return proc.returncode, recap, proc.stdout + proc.stderr


def types(node):
    """The vGPU type of each VF of the node's L40S, in VF order (no VFs: [])."""
    return [int(node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf))
            for vf in node.vfs(node.pfs("l40s")[0])]


def test_the_only_node_that_asks_for_the_sriov_role_fails_and_the_other_still_gets_its_layout(gpusim_node, tmp_path):
    """ansible-playbook ends the whole run after a play in which every host failed: the prerequisites play also
    holds one node that does not ask (its tasks skipped), so node-2's failure there leaves node-1 its layout."""
    nodes = [gpusim_node("l40s:1", fresh=True), gpusim_node("l40s:1", fresh=True)]
    # no such PCI function on node-2: the sriov role refuses it
    rc, recap, output = run_nodes_yml(nodes, tmp_path, {"node-2": {"vgpu_nodes_manage_sriov": True,
                                                                   "sriov_devices": ["0000:ff:00.0"]}})
    assert rc == 2, output
    assert recap["node-2"]["failed"] == 1 and recap["node-1"]["failed"] == 0, output
    assert "TASK [accelops.vgpu.sriov" in output
    assert sorted(types(nodes[0]), reverse=True)[:2] == [L40S_24Q, L40S_24Q] and types(nodes[0]).count(L40S_24Q) == 2
    assert types(nodes[1]) == [] and nodes[1].writes() == []


def test_no_node_asks_and_the_prerequisites_play_has_no_host(gpusim_node, tmp_path):
    node = gpusim_node("l40s:1", fresh=True)
    rc, recap, output = run_nodes_yml([node], tmp_path, {})
    assert rc == 0 and recap["node-1"]["failed"] == 0, output
    assert "skipping: no hosts matched" in output and "Could not match supplied host pattern" not in output
    assert "TASK [Install the host driver and enable VFs" not in output
    # the pick task's loop is never empty: ansible-core skips an empty loop through a deprecated result key whose
    # deprecation inspects the worker's whole stack; one placeholder item, skipped by its condition, costs less
    assert "skipping: [node-1] => (item=none: no node asks)" in output
    assert types(node).count(L40S_24Q) == 2
