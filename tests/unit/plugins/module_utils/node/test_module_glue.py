import contextlib

import pytest
import yaml

from ansible_collections.accelops.vgpu.plugins.doc_fragments.node_roots import ModuleDocFragment
from ansible_collections.accelops.vgpu.plugins.module_utils.node import module_glue
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import NodeLock
from ansible_collections.accelops.vgpu.tests.integration.dra_claims import prepare_claim
from ansible_collections.accelops.vgpu.tests.integration.pod_allocations import allocate_to_pod


class Exited(Exception):
    pass


class FakeModule:
    """The parts of AnsibleModule the glue uses; exit_json/fail_json raise like the real ones exit."""

    def __init__(self, params=None, check_mode=False, diff=False):
        self.params = dict(sysfs_root="/sys", dev_root="/dev", proc_root="/proc")
        self.params.update(params or {})
        self.check_mode, self._diff = check_mode, diff
        self.exited = None

    def run_command(self, argv):
        return 0, " ".join(argv), ""

    def exit_json(self, **result):
        self.exited = dict(result, failed=False)
        raise Exited()

    def fail_json(self, **result):
        self.exited = dict(result, failed=True)
        raise Exited()


def test_argspec_matches_the_doc_fragment():
    documented = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
    spec = module_glue.node_argspec()
    assert dict((k, (v["type"], v["default"])) for k, v in spec.items()) == \
        dict((k, (v["type"], v.get("default"))) for k, v in documented.items())


def test_own_options_are_added_to_a_fresh_copy():
    spec = module_glue.node_argspec(force=dict(type="bool", default=False))
    spec["sysfs_root"]["default"] = "/elsewhere"
    assert sorted(spec) == ["dev_root", "force", "kubelet_dir", "proc_root", "sysfs_root"]
    assert module_glue.NODE_ROOTS_ARGSPEC["sysfs_root"]["default"] == "/sys"


def test_node_context_builds_the_engine_objects_from_params(tmp_path):
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "1/fd").mkdir(parents=True)     # a process with no fds: proc_root must show one
    module = FakeModule(dict(sysfs_root=str(tmp_path), proc_root=str(tmp_path), dev_root=str(tmp_path)))
    node = module_glue.NodeContext(module)
    assert node.sysfs.root == str(tmp_path)
    assert node.runner.run(["echo", "hi"]) == (0, "echo hi", "")
    assert node.held() == {}


@pytest.mark.parametrize("root", ["sysfs_root", "dev_root", "proc_root", "kubelet_dir"])
def test_node_context_fails_the_module_on_a_missing_root(tmp_path, root):
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    params = dict(sysfs_root=str(tmp_path), proc_root=str(tmp_path), dev_root=str(tmp_path))
    params[root] = str(tmp_path / "typo")
    module = FakeModule(params)
    with pytest.raises(Exited):
        module_glue.NodeContext(module)
    assert module.exited == {"msg": "%s %s: no such directory" % (root, tmp_path / "typo"), "failed": True}


def test_node_context_holds_what_dra_claims_prepared_under_the_kubelet_dir_use(tmp_path):
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "1/fd").mkdir(parents=True)
    roots = dict(sysfs_root=str(tmp_path), proc_root=str(tmp_path), dev_root=str(tmp_path))
    claim = prepare_claim(tmp_path / "k0s-kubelet", "0000:41:00.4", 1155)
    pod = allocate_to_pod(tmp_path / "k0s-kubelet", "0000:41:00.5")     # sriov_vfs, vgpu_profile: the same answer
    assert module_glue.NodeContext(FakeModule(dict(roots, kubelet_dir=str(tmp_path / "k0s-kubelet")))).held() == {
        "0000:41:00.4": [claim], "0000:41:00.5": [pod]}
    node = module_glue.NodeContext(FakeModule(roots))   # not set: /var/lib/kubelet, absent here or without this claim
    assert node.kubelet_dir == "/var/lib/kubelet" and "0000:41:00.4" not in node.held()


def test_apply_lock_is_real_only_outside_check_mode():
    assert isinstance(module_glue.NodeContext(FakeModule()).apply_lock(1), NodeLock)
    assert isinstance(module_glue.NodeContext(FakeModule(check_mode=True)).apply_lock(1), contextlib.nullcontext)


def test_engine_error_becomes_one_fail_json_with_the_result_so_far():
    module = FakeModule()
    with pytest.raises(Exited):
        with module_glue.engine_errors(module) as result:
            result["pfs"] = ["0000:41:00.0"]
            raise EngineError("0000:41:00.0: broken")
    assert module.exited == {"msg": "0000:41:00.0: broken", "pfs": ["0000:41:00.0"], "failed": True}


@pytest.mark.parametrize("diff_mode", [False, True])
def test_diff_is_attached_only_in_diff_mode(diff_mode):
    module = FakeModule(diff=diff_mode)
    with pytest.raises(Exited):
        module_glue.exit_with_diff(module, True, {"before": {}, "after": {"x": 1}}, pfs=[])
    assert ("diff" in module.exited) is diff_mode and module.exited["changed"] is True
