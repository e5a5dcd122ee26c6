"""Read-modify-write with 409 retries, without a kubernetes client."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster import k8s_write as kc


class Plan:
    def __init__(self, patch):
        self.patch = patch


def test_read_modify_write_retries_conflicts_then_gives_up():
    reads, writes = [], []

    def write(obj, patch):
        writes.append(patch)
        if len(writes) < 3:
            raise kc.ConflictError("Thing x: conflict (HTTP 409): modified", status=409)

    obj, plan, attempts = kc.read_modify_write(lambda: reads.append(1) or {"n": len(reads)},
                                               lambda cur: Plan({"n": cur["n"]}), write, retries=5)
    assert attempts == 3 and obj == {"n": 3} and writes == [{"n": 1}, {"n": 2}, {"n": 3}]
    with pytest.raises(kc.K8sError, match=r"conflict \(HTTP 409\): modified \(gave up after 2 attempts\)"):
        kc.read_modify_write(dict, lambda cur: Plan({}), write_always_conflicts, retries=1)


def write_always_conflicts(obj, patch):
    raise kc.ConflictError("Thing x: conflict (HTTP 409): modified", status=409)


def test_nothing_to_do_means_no_write():
    obj, plan, attempts = kc.read_modify_write(dict, lambda cur: Plan(None), write_always_conflicts, retries=0)
    assert attempts == 1 and plan.patch is None


def test_the_planners_and_the_cluster_filter_do_not_load_the_kubernetes_client():
    """k8s_write, kubevirt, gpu_operator and the vgpu_cluster filter stay client-free: Ansible loads the
    filter in every worker that resolves one of this collection's filters (a third of a second each)."""
    code = ("import sys; import ansible_collections.accelops.vgpu.plugins.filter.vgpu_cluster; "
            "import ansible_collections.accelops.vgpu.plugins.module_utils.cluster.gpu_operator; "
            "print('kubernetes' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": ":".join(sys.path)})
    assert run.stdout.strip() == "False"
