"""Bad inputs (the tables in cases.py): one line naming the object, and zero writes.

Writes are what the system under test saw: the gpusim write log (every attempt, ok or refused),
the API server's mutating requests, commands that would build/install, files in output dirs.
"""

from __future__ import annotations

import json

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import ImageBuild
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.nvdriver import DriverManager
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import (
    CLUSTER_POLICY, KUBEVIRT, default_state, kubeconfig_dict)
from ansible_collections.accelops.vgpu.tests.reliability import build_host, cases, node_lab
from ansible_collections.accelops.vgpu.tests.reliability.module_runs import run_module
from ansible_collections.accelops.vgpu.tests.reliability.assertions import one_line_naming, params


@pytest.mark.parametrize("row", params(cases.NODE))
def test_node_input_is_refused_in_one_line_without_writes(row, lab, tmp_path, failure_writes):
    args = dict(row["args"], tmp_path=tmp_path) if row["run"] == "config_file" else row["args"]
    watched = (node_lab.HELD_VF, node_lab.SECOND_VF, node_lab.TYPED_VF)
    types_before = dict((vf, lab.vgpu_type(vf)) for vf in watched)
    lab.node.clear_log()
    try:
        with pytest.raises(EngineError) as caught:
            node_lab.RUNNERS[row["run"]](lab, **args)
    finally:
        attempts = failure_writes.gpusim(lab.node)
        if attempts:
            lab.restore()  # keep the shared node in its known state for the next rows
    assert attempts == []
    one_line_naming(str(caught.value), row["names"].format(tmp=tmp_path))
    assert dict((vf, lab.vgpu_type(vf)) for vf in watched) == types_before


HAND_WRITTEN = {  # what a runbook left in the KubeVirt CR for our devices, under another name
    "hand-written-l40s": ("pciHostDevices", {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/L40S-24Q"}),
    "hand-written-l40s-lower-case": ("pciHostDevices", {"pciVendorSelector": "10de:26b9",
                                                        "resourceName": "nvidia.com/L40S-24Q"}),
    "hand-written-l40s-external": ("pciHostDevices", {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/L40S-24Q",
                                                      "externalResourceProvider": True}),
    "hand-written-a16-mdev": ("mediatedDevices", {"mdevNameSelector": "NVIDIA A16-4Q", "resourceName": "example.org/a16-small"}),
}


def cluster_state(name):
    """The API server's content for a case (see cases.CLUSTER `cluster`)."""
    state = default_state("v1.5.0" if name == "old-kubevirt" else "v1.9.0")
    if name in HAND_WRITTEN:
        kind, entry = HAND_WRITTEN[name]
        state["objects"][0]["body"]["spec"]["configuration"]["permittedHostDevices"][kind].append(entry)
    if name == "no-kubevirt-crd":
        del state["resources"][KUBEVIRT]
    drop = {"no-kubevirt-cr": KUBEVIRT, "no-kubevirt-crd": KUBEVIRT, "no-cluster-policy": CLUSTER_POLICY}.get(name)
    state["objects"] = [o for o in state["objects"] if o["resource"] != drop]
    return state


def kubeconfig_variant(kind, api_server, tmp_path):
    """The value of the `kubeconfig` option for a case: a path (valid, broken, missing) or a dict
    (dict-without-context, dict-clusters-not-a-list)."""
    path = tmp_path / ("kubeconfig-" + kind)
    if kind == "valid":
        path.write_text(json.dumps(kubeconfig_dict(api_server.url)))
    elif kind == "broken":
        path.write_text("apiVersion: v1\nclusters: [\n  {name: test, cluster: {server: ")
    elif kind.startswith("dict-"):
        config = kubeconfig_dict(api_server.url)
        if kind == "dict-without-context":
            del config["current-context"], config["contexts"]
        else:
            config["clusters"] = "test"
        return config
    return str(path)


@pytest.mark.parametrize("row", params(cases.CLUSTER))
def test_cluster_input_is_refused_in_one_line_without_writes(row, api_server, tmp_path, failure_writes):
    api_server.reset(cluster_state(row["cluster"]))
    if row["cluster"] == "forbid-list-kubevirts":
        api_server.forbid("GET", "kubevirts")
    kubeconfig = kubeconfig_variant(row["args"]["kubeconfig"], api_server, tmp_path)
    run = run_module(row["module"], dict(row["args"], kubeconfig=kubeconfig))
    writes = failure_writes.api(api_server)
    assert run.failed and writes == []
    one_line_naming(run.message, row["names"].format(kubeconfig=kubeconfig))


@pytest.fixture(scope="module")
def runfile_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("runfiles")
    build_host.runfiles(directory)
    return directory


@pytest.mark.parametrize("row", params(cases.IMAGE))
def test_image_input_is_refused_in_one_line_without_writes(row, runfile_dir, failure_writes):
    runner, registry = build_host.QueryOnlyRunner(), build_host.NoRegistry()
    options = build_host.image_params(runfile_dir, **row["params"])
    failure_writes.files(options["work_dir"])
    with pytest.raises(EngineError) as caught:
        ImageBuild(runner, options, registry_client=registry).apply()
    assert failure_writes.commands(runner) == [] and failure_writes.changed() == []
    one_line_naming(str(caught.value), row["names"].format(tmp=runfile_dir))


@pytest.mark.parametrize("row", params(cases.DRIVER))
def test_driver_input_is_refused_in_one_line_without_writes(row, lab, runfile_dir, failure_writes):
    runner = build_host.QueryOnlyRunner()
    params = json.loads(json.dumps(row["params"]).replace("{dev}", lab.node.dev_root))
    options = build_host.driver_params(runfile_dir, lab.node.root, **params)
    lab.node.clear_log()
    failure_writes.files(options["modprobe_dir"])
    manager = DriverManager(runner, options["sysfs_root"], options["modprobe_dir"], options["proc_root"],
                            options["dev_root"], options["modules_dir"])
    with pytest.raises(EngineError) as caught:
        manager.apply(options)
    assert failure_writes.commands(runner) == [] and failure_writes.changed() == []
    assert failure_writes.gpusim(lab.node) == []
    assert lab.node.state()["nvidia"] == {"loaded": True, "version": build_host.DRIVER_LOADED}
    one_line_naming(str(caught.value), row["names"].format(tmp=runfile_dir))


def placeholders(value, lab, tmp_path):
    """{root}, {dev} and {tmp} in a case replaced by the lab node's roots and the case's tmp_path."""
    text = json.dumps(value).replace("{root}", lab.node.root).replace("{dev}", lab.node.dev_root)
    return build_host.fill(json.loads(text), tmp_path)


@pytest.mark.parametrize("row", params(cases.NODE_MODULES))
def test_node_module_input_is_refused_in_one_line_without_writes(row, lab, runfile_dir, failure_writes):
    args = placeholders(row["args"], lab, runfile_dir)
    lab.node.clear_log()
    run = run_module(row["module"], args, env=lab.node.env)
    attempts = failure_writes.gpusim(lab.node)
    assert run.failed and attempts == []
    one_line_naming(run.message, placeholders(row["names"], lab, runfile_dir))


@pytest.mark.parametrize("row", params(cases.ROLES))
def test_role_input_is_refused_in_one_line_without_writes(row, lab, tmp_path, run_playbook, failure_writes):
    task = {"name": "role", "ansible.builtin.include_role": {"name": "accelops.vgpu." + row["role"]}}
    lab.node.clear_log()
    failure_writes.files(tmp_path / "node")
    run = run_playbook([task], lab.node, extra_vars=placeholders(row["vars"], lab, tmp_path))
    attempts, installed = failure_writes.gpusim(lab.node), failure_writes.changed()
    failed = [r for r in run.results if r.get("failed")]
    assert run.rc == 2 and len(failed) == 1, run
    assert attempts == [] and installed == []
    one_line_naming(failed[0]["msg"], row["names"])
