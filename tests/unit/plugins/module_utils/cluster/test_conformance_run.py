"""The I/O layer of a conformance run, with a fake API: input checks, waits, cleanup, signals."""

from __future__ import annotations

import os
import signal

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance import run
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance.checks import ConformanceError
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_client import K8sError

PARAMS = {"running_timeout": 10, "ready_timeout": 10, "pending_timeout": 5, "cleanup_timeout": 3,
          "guest_command_timeout": 5, "poll_interval": 1, "namespace": "vgpu-conformance"}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class FakeApi:
    """Holds VMIs, ResourceClaims and namespaces; VMI deletes take effect after `lag` list calls."""

    def __init__(self, vmis=(), namespaces=None, lag=0, forbid_delete=False, claims=()):
        self.vmis = dict((n, {"metadata": {"name": n}}) for n in vmis)
        self.claims = dict((n, {"metadata": {"name": n}}) for n in claims)
        self.namespaces = dict(namespaces or {})
        self.lag, self.forbid_delete, self.calls, self.pending = lag, forbid_delete, [], []

    def list_claims(self, namespace, run_id):
        self.calls.append(("list-claims", namespace))
        return dict(self.claims)

    def delete_claim(self, namespace, name):
        self.calls.append(("delete-claim", name))
        if name not in self.claims:
            raise K8sError("not found", status=404)
        self.claims.pop(name)

    def list_vmis(self, namespace, run_id):
        self.calls.append(("list", namespace))
        if self.pending and self.lag <= 0:
            for name in self.pending:
                self.vmis.pop(name, None)
            self.pending = []
        self.lag -= 1
        return dict(self.vmis)

    def delete_vmi(self, namespace, name):
        self.calls.append(("delete", name))
        if self.forbid_delete:
            raise K8sError("VirtualMachineInstance %s/%s: forbidden (HTTP 403): no" % (namespace, name), status=403)
        if name not in self.vmis:
            raise K8sError("not found", status=404)
        self.pending.append(name)

    def get_namespace(self, name):
        return self.namespaces.get(name)

    def delete_namespace(self, name):
        self.calls.append(("delete-namespace", name))
        self.namespaces.pop(name)


@pytest.mark.parametrize("change, message", [
    ({"ready_timeout": 0}, "ready_timeout 0: must be a number of seconds greater than 0"),
    ({"cleanup_timeout": None}, "cleanup_timeout None: must be a number of seconds greater than 0"),
    ({"poll_interval": 6}, "poll_interval 6: must not be longer than the shortest timeout"),
    ({"namespace": "x" * 64}, "namespace %s: not a valid namespace name (DNS-1123 label)" % ("x" * 64)),
    ({"guest_command": "nvidia-smi", "guest_runner": ["sh", "-c", "true"]}, "guest_runner sh -c true: no {command} placeholder"),
])
def test_inputs_are_checked_in_one_line(change, message):
    with pytest.raises(ConformanceError) as err:
        run.validate_params(dict(PARAMS, **change))
    assert str(err.value) == message


def test_wait_for_returns_at_the_deadline_with_the_last_state():
    clock, api = Clock(), FakeApi(["a"])
    seen = run.wait_for(api, "ns", "r", lambda v: not v, 3, 1, clock, clock.sleep)
    assert list(seen) == ["a"] and clock.now == 3 and len(api.calls) == 4


def test_cleanup_deletes_the_vmis_waits_for_them_then_deletes_only_our_namespace():
    clock = Clock()
    api = FakeApi(["v-1", "v-2"], {"vgpu-conformance": {"metadata": {"labels": {run.workloads.RUN_LABEL: "r1"}}}}, lag=1)
    created = run.Created("vgpu-conformance", "r1")
    created.namespace_ours, created.vmis = True, ["v-1", "v-3"]
    result = created.cleanup(api, PARAMS, clock, clock.sleep)
    assert result == {"deleted": ["VirtualMachineInstance vgpu-conformance/v-1", "VirtualMachineInstance vgpu-conformance/v-2",
                                  "Namespace vgpu-conformance"], "left": []}
    assert api.calls[-1] == ("delete-namespace", "vgpu-conformance")


def test_cleanup_deletes_claims_after_their_vmis_are_gone_and_finds_claims_by_the_run_label():
    clock = Clock()
    api = FakeApi(["v-1"], {"ns": {"metadata": {"labels": {run.workloads.RUN_LABEL: "r1"}}}}, lag=1,
                  claims=["v-1", "v-2"])
    created = run.Created("ns", "r1")
    created.namespace_ours, created.vmis, created.claims = True, ["v-1"], ["v-1"]
    result = created.cleanup(api, PARAMS, clock, clock.sleep)
    assert result == {"deleted": ["VirtualMachineInstance ns/v-1", "ResourceClaim ns/v-1", "ResourceClaim ns/v-2",
                                  "Namespace ns"], "left": []}
    assert api.calls.index(("delete-claim", "v-1")) > max(i for i, c in enumerate(api.calls) if c == ("list", "ns"))
    # a run that created no claim does not look for any
    api = FakeApi([], {"ns": {"metadata": {"labels": {run.workloads.RUN_LABEL: "r1"}}}}, claims=["x"])
    created = run.Created("ns", "r1")
    created.namespace_ours = True
    created.cleanup(api, PARAMS, clock, clock.sleep)
    assert "x" in api.claims and not [c for c in api.calls if c[0].endswith("claims")]


def test_the_pending_workload_is_deleted_and_gone_before_the_others_free_their_devices():
    api = FakeApi(["v-1", "v-2", "v-3"], claims=["v-1", "v-2", "v-3"])
    created = run.Created("ns", "r1")
    run._delete_workloads(api, created, ["v-1", "v-2", "v-3"], ["v-1", "v-2", "v-3"], PARAMS, pending="v-3")
    deletes = [c for c in api.calls if c[0].startswith("delete")]
    assert deletes == [("delete", "v-3"), ("delete-claim", "v-3"), ("delete", "v-1"), ("delete", "v-2"),
                       ("delete-claim", "v-1"), ("delete-claim", "v-2")]
    # its VMI and its claim were seen gone before the first other VMI was deleted
    first_other = api.calls.index(("delete", "v-1"))
    assert ("list", "ns") in api.calls[:api.calls.index(("delete-claim", "v-3"))]
    assert ("list-claims", "ns") in api.calls[:first_other]
    assert not api.vmis and not api.claims


def test_cleanup_leaves_a_namespace_of_another_run_or_owner_alone():
    clock = Clock()
    api = FakeApi([], {"vgpu-conformance": {"metadata": {"labels": {}}}})
    created = run.Created("vgpu-conformance", "r1")
    created.namespace_ours = True   # its create failed with 409: someone else's
    assert created.cleanup(api, PARAMS, clock, clock.sleep) == {"deleted": [], "left": []}
    assert "vgpu-conformance" in api.namespaces


def test_cleanup_reports_what_it_could_not_delete():
    clock = Clock()
    api = FakeApi(["v-1"], forbid_delete=True)
    created = run.Created("ns", "r1")
    created.vmis = ["v-1"]
    result = created.cleanup(api, PARAMS, clock, clock.sleep)
    assert result["left"] == ["VirtualMachineInstance ns/v-1 (VirtualMachineInstance ns/v-1: forbidden (HTTP 403): no)",
                              "VirtualMachineInstance ns/v-1 (still there after 3s)"]


def test_a_signal_becomes_an_exception_where_the_run_is_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(run.Interrupted, match="^interrupted by SIGTERM$"):
        with run.interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()  # not reached: the handler raises first
    assert signal.getsignal(signal.SIGTERM) is before
    with run.uninterrupted():
        os.kill(os.getpid(), signal.SIGTERM)   # ignored while cleaning up
    assert signal.getsignal(signal.SIGTERM) is before


def test_guest_runner_fills_the_placeholders(tmp_path):
    script = tmp_path / "runner"
    script.write_text("#!/bin/sh\necho \"$1 $2 $3\"\n[ \"$2\" = bad ] && exit 3\nexit 0\n")
    script.chmod(0o755)
    params = dict(PARAMS, guest_command="nvidia-smi -L", guest_runner=[str(script), "{namespace}", "{vmi}", "{command}"])
    assert run.run_guest(params, "ns", ["good", "bad"]) == {"good": (0, "ns good nvidia-smi -L"),
                                                            "bad": (3, "ns bad nvidia-smi -L")}
    assert run.run_guest(dict(params, guest_command=None), "ns", ["good"]) == {}
