"""Whole GPU or vGPUs on one counter (issue 42 item 1) against gpusim: the declaration, the published device, Prepare
(VFs off, PF to vfio-pci, CDI with its VFIO group, metadata with the PF) and Unprepare (back to vGPUs), refusals
while a VF is typed, held, allocated or prepared, and a crash at every step recovered."""

import json
import os
import time

import pytest
from claim_data import ClaimStore, claim, ref
from schemas import assert_valid

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import cdi, checkpoint, claim_time, devices, metadata
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import slices, whole_gpu
from ansible_collections.accelops.vgpu.plugins.module_utils import node_cli
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claim_time_prepare import ClaimTimePreparer
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import whole_gpu as node_whole
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, pod_allocations
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.kubelet_holders import node_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner

NODE = "gpu-node-1"
GPU1 = "0000:42:00.0"
DOC = {"version": "v1", "vgpu-configs": {"default": [{"devices": [0], "vgpu-devices": {"L40S-24Q": 2}}]},
       "claim-time": [{"devices": [1], "profiles": ["L40S-24Q", "L40S-12Q"], "whole-gpu": True}]}
WHOLE, D24 = "whole-gpu-0000-42-00-0", "l40s-24q-gpu-0000-42-00-0"
UIDS = ["%08d-aaaa-4bbb-8ccc-000000000000" % n for n in range(1, 10)]


class Env:
    def __init__(self, node, monkeypatch, tmp_path, *claims):
        for name in ("PATH", "GPUSIM_ROOT"):
            monkeypatch.setenv(name, node.env[name])
        self.node, self.tmp = node, tmp_path
        self.kubelet = str(tmp_path / "kubelet")
        self.engine = self.make_engine()
        vgpu_apply.apply(self.engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True)
        self.result = self.reconcile()
        self.store = ClaimStore(*claims)
        self.plugin_dir, self.cdi_dir = claim_holders.plugin_dir(self.kubelet), str(tmp_path / "cdi")
        self.driver = self.start()
        node.clear_log()

    def make_engine(self):
        return vgpu_apply.NodeEngine(Sysfs(self.node.root), CommandRunner(), self.node.dev_root, "/proc",
                                     cache_dir=str(self.tmp), kubelet_dir=self.kubelet)

    def reconcile(self, doc=None):
        doc = doc or DOC
        self.engine.claim_time_declaration = declaration(doc)
        return vgpu_apply.apply(self.engine, vgpu_layout.from_document(doc, "default"), enable_vfs=True)

    def start(self):
        sysfs = self.engine.sysfs
        holders = node_holders(sysfs, self.node.dev_root, "/proc", self.kubelet)   # as agent_plugin wires them
        driver = DraDriver(NODE, self.store.get, devices.NodeView(sysfs, lambda: facts.gather(sysfs, {})),
                           self.plugin_dir, self.cdi_dir, boot_id=self.engine.boot_id,
                           typer=ClaimTimePreparer(sysfs, holders),
                           whole=whole_gpu.WholeGpuPreparer(sysfs, holders, CommandRunner(),
                                                            pod_allocations.record_path(self.kubelet)))
        self.offer(driver)
        return driver

    def offer(self, driver=None):
        items = claim_time.offers(self.engine.sysfs, self.result["claim_time"])
        for preparer in ((driver or self.driver).typer, (driver or self.driver).whole):
            preparer.update(items)
        return items

    def pf_driver(self):
        link = os.path.join(self.node.root, "bus/pci/devices", GPU1, "driver")
        return os.path.basename(os.readlink(link)) if os.path.islink(link) else None

    def numvfs(self):
        return int(open(os.path.join(self.node.root, "bus/pci/devices", GPU1, "sriov_numvfs")).read())

    def record(self, uid):
        return checkpoint.Checkpoint(self.plugin_dir).get(uid)


@pytest.fixture
def env(gpusim_node, monkeypatch, tmp_path):
    def make(*claims):
        return Env(gpusim_node("l40s:2"), monkeypatch, tmp_path, *claims)
    return make


def test_the_declaration_is_validated_and_bad_input_writes_nothing():
    assert declaration(DOC).entries[0].whole is True
    assert declaration({"claim_time": [{"devices": [GPU1]}]}).entries[0].whole is False
    with pytest.raises(LayoutError, match=r"claim-time\[0\]: whole-gpu must be true or false, not yes"):
        declaration({"claim-time": [{"devices": [1], "whole-gpu": "yes"}]}, "config")
    with pytest.raises(LayoutError, match=r"claim_time\[0\]: whole_gpu is for time-sliced claim-time GPUs"):
        declaration({"claim_time": [{"devices": [GPU1], "profiles": ["H100-1-10C"], "whole_gpu": True}]})


def test_the_whole_gpu_is_published_beside_its_profiles_and_draws_every_counter(env):
    e = env()
    items = e.offer()
    [counter_set] = [i for i in items if isinstance(i, claim_time.CounterSet)]
    [whole] = [i for i in items if isinstance(i, whole_gpu.WholeGpuDevice)]
    api = whole.to_api()
    assert api["name"] == WHOLE and "allowMultipleAllocations" not in api
    assert api["consumesCounters"] == [{"counterSet": counter_set.name, "counters": counter_set.to_api()["counters"]}]
    attrs = api["attributes"]
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": GPU1} and attrs["wholeGPU"] == {"bool": True}
    assert attrs["productName"]["string"].endswith("L40S") or "L40S" in attrs["productName"]["string"]
    # a GPU not declared whole-gpu publishes none; the slices of 8 such GPUs stay within the API's limits (strict)
    gpus = [dict(e.result["claim_time"][0], address="0000:%02x:00.0" % (0x41 + n)) for n in range(8)]
    many = claim_time.offers(e.engine.sysfs, gpus)
    assert len([i for i in many if isinstance(i, whole_gpu.WholeGpuDevice)]) == 8
    for body in slices.desired_slices(NODE, many, 1):
        assert len(body["spec"].get("devices") or ()) <= 64 and len(body["spec"].get("sharedCounters") or ()) <= 8
        assert not (body["spec"].get("devices") and body["spec"].get("sharedCounters"))
        assert_valid(body)


def test_a_restarted_agent_reads_the_whole_device_back_from_the_slices(env):
    """claim_time.from_slices (a restarted agent whose first applies fail keeps what it published): the whole device
    too, as published, with its GPU's counter set."""
    e = env()
    items = e.offer()
    again = claim_time.from_slices(slices.desired_slices(NODE, items, 1))
    assert [i.to_api() for i in again if isinstance(i, whole_gpu.WholeGpuDevice)] == [
        i.to_api() for i in items if isinstance(i, whole_gpu.WholeGpuDevice)]
    assert [i.name for i in again if isinstance(i, claim_time.CounterSet)] == ["gpu-0000-42-00-0"]


def test_prepare_gives_the_gpu_whole_and_unprepare_gives_its_vgpus_back(env, capsys):
    one, two = claim("vm-whole", UIDS[0], [WHOLE], NODE), claim("vm-24q", UIDS[1], [D24], NODE)
    e = env(one, two)
    assert e.pf_driver() == "nvidia" and e.numvfs() == 32
    answer = e.driver.prepare([ref(one)])[UIDS[0]]
    assert answer.error == "" and answer.devices[0]["device"] == WHOLE
    assert e.pf_driver() == "vfio-pci" and e.numvfs() == 0
    entry = e.record(UIDS[0])
    assert entry["state"] == checkpoint.COMPLETED and entry["devices"][0]["key"] == GPU1
    assert entry["devices"][0]["whole"]["step"] == node_whole.STEP_BOUND
    # the writes in order: VFs off first (sriov-manage -d), then override, unbind, bind
    writes = [(w["path"], w["value"]) for w in e.node.log() if w["result"] == "ok"]
    numvfs = writes.index(("bus/pci/devices/%s/sriov_numvfs" % GPU1, "0"))
    assert numvfs < len(writes) - 3 and writes[-3:] == [
        ("bus/pci/devices/%s/driver_override" % GPU1, "vfio-pci"), ("bus/pci/drivers/nvidia/unbind", GPU1),
        ("bus/pci/drivers/vfio-pci/bind", GPU1)]
    with open(cdi.spec_path(e.cdi_dir, devices.DRIVER, UIDS[0])) as handle:
        nodes = [n["path"] for n in json.load(handle)["devices"][0]["containerEdits"]["deviceNodes"]]
    group = os.path.basename(os.readlink(os.path.join(e.node.root, "bus/pci/devices", GPU1, "iommu_group")))
    assert nodes[:2] == ["/dev/vfio/vfio", "/dev/vfio/%s" % group]
    with open(metadata.file_path(e.plugin_dir, "vms", "vm-whole", "gpu")) as handle:
        attrs = metadata.read_stream(handle.read())[0]["requests"][0]["devices"][0]["attributes"]
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": GPU1}
    # the reconcile leaves it alone, does not call it reserved, and keeps offering what it offered
    result = e.reconcile()
    [gpu] = [g for g in result["claim_time"] if g["address"] == GPU1]
    assert "reserved" not in gpu and gpu["held_whole"]["by"] == "DRA claim vms/vm-whole" and gpu["profiles"]
    assert e.pf_driver() == "vfio-pci" and e.numvfs() == 0
    assert {i.name for i in claim_time.offers(e.engine.sysfs, result["claim_time"])} == {i.name for i in e.offer()}
    node_cli._print_apply(result, True)     # accelops-vgpu apply --check says so, not "reserved"
    assert "%s (L40S, claim-time): given whole to DRA claim vms/vm-whole (on vfio-pci, VFs off; step bound)" % GPU1 \
        in capsys.readouterr().out
    # unprepare: back to nvidia, VFs again, and a vGPU claim of the GPU is prepared
    assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""}
    assert e.pf_driver() == "nvidia" and e.numvfs() == 32 and e.record(UIDS[0]) is None
    assert open(os.path.join(e.node.root, "bus/pci/devices", GPU1, "driver_override")).read().strip() == "(null)"
    assert e.driver.prepare([ref(two)])[UIDS[1]].error == ""


@pytest.mark.parametrize("how", ["typed", "held", "prepared", "allocated"])
def test_a_vf_typed_held_prepared_or_allocated_blocks_the_whole_gpu_and_nothing_is_written(env, how):
    one, two = claim("vm-whole", UIDS[0], [WHOLE], NODE), claim("vm-24q", UIDS[1], [D24], NODE)
    e = env(one, two)
    vf = e.node.vfs(GPU1)[3]
    if how == "typed":
        e.engine.sysfs.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf, 1155)
        why = "VF %s has vGPU type 1155" % vf
    elif how == "held":
        e.node.hold(vf)
        why = "VF %s is held by" % vf
    elif how == "prepared":
        assert e.driver.prepare([ref(two)])[UIDS[1]].error == ""
        vf = e.record(UIDS[1])["devices"][0]["key"]
        why = "VF %s is held by DRA claim vms/vm-24q" % vf
    else:   # a device plugin allocation to a live pod (the agent's allocation record)
        pod_allocations.write(pod_allocations.record_path(e.kubelet), {vf: {
            "resource": "nvidia.com/NVIDIA_L40S-24Q", "allocatedAt": time.time(), "pod": "vms/virt-launcher-x"}})
        why = "VF %s is held by" % vf
    e.node.clear_log()
    answer = e.driver.prepare([ref(one)])[UIDS[0]]
    assert answer.devices == [] and answer.error.startswith(
        "claim vms/vm-whole: device %s: GPU %s cannot be given whole: %s" % (WHOLE, GPU1, why))
    assert e.node.log() == [] and e.record(UIDS[0]) is None and e.pf_driver() == "nvidia"


def test_without_the_vfio_pci_driver_loaded_the_whole_gpu_is_refused_before_any_write(env, monkeypatch):
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    isdir = Sysfs.isdir
    monkeypatch.setattr(Sysfs, "isdir", lambda self, rel: rel != "bus/pci/drivers/vfio-pci" and isdir(self, rel))
    e.node.clear_log()
    answer = e.driver.prepare([ref(one)])[UIDS[0]]
    assert answer.devices == [] and answer.error.startswith(
        "claim vms/vm-whole: device %s: GPU %s cannot be given whole: the vfio-pci driver is not loaded" % (WHOLE, GPU1))
    assert e.node.log() == [] and e.record(UIDS[0]) is None and whole_state(e) == ("nvidia", 32)


def test_a_gpu_an_operator_bound_to_vfio_pci_is_not_taken_nor_called_ours(env):
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    e.driver.prepare([ref(one)])
    e.driver.unprepare([ref(one)])
    e.node.bind(GPU1, "vfio-pci")       # an operator's passthrough, no record
    answer = e.driver.prepare([ref(one)])[UIDS[0]]
    assert "it is bound to vfio-pci, not by this driver" in answer.error
    [gpu] = [g for g in e.reconcile()["claim_time"] if g["address"] == GPU1]
    assert "reserved" in gpu and "held_whole" not in gpu


# --- a crash (kill -9) at every step, then a restart ----------------------------------------------------------------

class Crash(BaseException):
    """The agent is killed here: nothing after it runs (no rollback, no record)."""


class Dying:
    """The preparer's sysfs, its set_vfs and its step recorder as seen by a process killed at `point`: after the
    point every call raises Crash, so nothing else is written or recorded."""

    def __init__(self, e, point):
        self.e, self.kind, self.target = e, point[0], point[1]
        self.dead = False
        real_sysfs, real_set_vfs, real_step = e.driver.whole.sysfs, e.driver.whole._set_vfs, e.driver._whole_step
        this = self

        class Sysfs:
            def __getattr__(self, name):
                this.alive()
                return getattr(real_sysfs, name)

            def write(self, path, value):
                this.alive()
                real_sysfs.write(path, value)
                this.maybe("write", path.endswith(this.target))

        def set_vfs(pf, count):
            this.alive()
            real_set_vfs(pf, count)
            this.maybe("vfs", count == this.target)

        def whole_step(ref_, name):
            step = real_step(ref_, name)

            def recorded(value):
                this.alive()
                step(value)
                this.maybe("step", value == this.target)
            return recorded
        e.driver.whole.sysfs, e.driver.whole._set_vfs, e.driver._whole_step = Sysfs(), set_vfs, whole_step

    def alive(self):
        if self.dead:
            raise Crash()

    def maybe(self, kind, hit):
        if kind == self.kind and hit:
            self.dead = True
            raise Crash()


PREPARE_POINTS = [("step", node_whole.STEP_DISABLE), ("vfs", 0), ("step", node_whole.STEP_BIND),
                  ("write", "driver_override"), ("write", "nvidia/unbind"), ("write", "vfio-pci/bind"),
                  ("step", node_whole.STEP_BOUND)]
UNPREPARE_POINTS = [("step", node_whole.STEP_RETURN), ("write", "driver_override"), ("write", "vfio-pci/unbind"),
                    ("write", "nvidia/bind"), ("step", node_whole.STEP_ENABLE), ("vfs", "max")]


def whole_state(e):
    return e.pf_driver(), e.numvfs()


@pytest.mark.parametrize("point", PREPARE_POINTS, ids=["%s-%s" % p for p in PREPARE_POINTS])
@pytest.mark.parametrize("then", ["retried", "deleted"])
def test_a_crash_at_each_prepare_step_is_recovered_forward_by_the_retry_or_back_once_the_claim_is_gone(
        env, point, then):
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    Dying(e, point)
    with pytest.raises(Crash):
        e.driver.prepare([ref(one)])
    entry = e.record(UIDS[0])
    assert entry["state"] == checkpoint.STARTED and entry["devices"][0]["whole"]["step"] in node_whole.PREPARE_STEPS
    left = whole_state(e)
    result = e.reconcile()      # the restarted agent's first reconcile: the GPU is the claim's, left as it is
    assert whole_state(e) == left and "reserved" not in [g for g in result["claim_time"] if g["address"] == GPU1][0]
    e.driver = e.start()
    if then == "retried":       # the kubelet's retry: forward
        assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
        assert whole_state(e) == ("vfio-pci", 0) and e.record(UIDS[0])["state"] == checkpoint.COMPLETED
        assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""}
    else:                       # deleted meanwhile: clean_stale gives the GPU back
        e.store.objects.clear()
        assert e.driver.clean_stale(lambda line: None, min_age=0) == [UIDS[0]]
    assert whole_state(e) == ("nvidia", 32) and e.record(UIDS[0]) is None


@pytest.mark.parametrize("point", UNPREPARE_POINTS, ids=["%s-%s" % p for p in UNPREPARE_POINTS])
def test_a_crash_at_each_unprepare_step_is_recovered_forward_by_the_retry(env, point):
    one, two = claim("vm-whole", UIDS[0], [WHOLE], NODE), claim("vm-24q", UIDS[1], [D24], NODE)
    e = env(one, two)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    Dying(e, point)
    with pytest.raises(Crash):
        e.driver.unprepare([ref(one)])
    assert e.record(UIDS[0])["devices"][0]["whole"]["step"] in (node_whole.STEP_RETURN, node_whole.STEP_ENABLE)
    left = whole_state(e)
    e.reconcile()
    assert whole_state(e) == left
    e.driver = e.start()
    assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""}
    assert whole_state(e) == ("nvidia", 32) and e.record(UIDS[0]) is None
    assert e.driver.prepare([ref(two)])[UIDS[1]].error == ""


def test_after_a_reboot_the_reconcile_leaves_the_gpu_to_the_claim_and_the_kubelet_prepares_it_again(env):
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    e.node.ctl("reboot")        # the PF is on nvidia again, without VFs; the record stays (the kubelet dir)
    assert whole_state(e) == ("nvidia", 0)
    e.reconcile()               # the boot unit / agent apply with enable_vfs: not this GPU's VFs
    assert whole_state(e) == ("nvidia", 0)
    e.driver = e.start()
    e.driver.checkpoint.boot_id = "another-boot"
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    assert whole_state(e) == ("vfio-pci", 0)


# --- the scheduler double over a seeded sequence: one GPU is never whole and vGPUs at once ---------------------------

CLASS = {"metadata": {"name": "vgpu.accelops.io"},
         "spec": {"selectors": [{"cel": {"expression": 'device.driver == "vgpu.accelops.io"'}}]}}
KINDS = {"whole": "whole", "24q": "L40S-24Q", "12q": "L40S-12Q"}


def scheduled(name, uid, profile):
    """A claim as a VMI template makes it: one request selecting a profile (`whole`: the whole GPU) by CEL."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "vms", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "vgpu.accelops.io", "allocationMode": "ExactCount", "count": 1, "selectors": [
                    {"cel": {"expression": 'device.attributes["vgpu.accelops.io"].profile == "%s"' % profile}}]}}]}}}


def test_a_seeded_sequence_of_claims_never_gets_one_gpu_whole_and_as_vgpus_and_every_allocation_prepares(env):
    """kube-scheduler's allocation (tests/fakes/vmi_controller.py DraAllocator: counters, shared devices) over the
    slices the node publishes, each allocation prepared for real on gpusim, releases unprepared: the whole device and
    the profile devices draw on one counter, so the allocator never hands out both, and no Prepare is refused."""
    import random
    from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import DraAllocator, Unallocatable
    e = env()
    rnd = random.Random(4215)
    live, kinds, refused, n = {}, {}, 0, 0
    for step in range(36):
        if live and (rnd.random() < 0.4 or len(live) >= 4):
            name = rnd.choice(sorted(live))
            body = live.pop(name)
            assert e.driver.unprepare([ref(body)]) == {body["metadata"]["uid"]: ""}
            del e.store.objects["vms", name]
        else:
            n += 1
            kind = rnd.choice(sorted(KINDS))
            body = scheduled("vm-%d" % n, "%08d-bbbb-4ccc-8ddd-000000000000" % n, KINDS[kind])
            published = slices.desired_slices(NODE, e.offer(), 1)
            allocator = DraAllocator([CLASS], published, {("vms", k): v for k, v in live.items()})
            try:
                body["status"] = {"allocation": allocator.allocate(body, NODE)}
            except Unallocatable:
                refused += 1
                continue
            e.store.objects["vms", body["metadata"]["name"]] = body
            answer = e.driver.prepare([ref(body)])[body["metadata"]["uid"]]
            assert answer.error == "", "step %d: %s" % (step, answer.error)
            live[body["metadata"]["name"]], kinds[body["metadata"]["name"]] = body, kind
        now = {kinds[name] for name in live}
        assert not ("whole" in now and now - {"whole"}), "step %d: GPU %s whole and as vGPUs: %s" % (step, GPU1, now)
        assert whole_state(e) == (("vfio-pci", 0) if "whole" in now else ("nvidia", 32))
        if step % 9 == 8:       # a reconcile now and then: what it offers does not change under the claims
            e.result = e.reconcile()
    assert refused and {kinds[name] for name in kinds} == set(KINDS)


# --- trying to break it (a fleet's day: restarts, reboots, stale allocations, operators) -----------------------------

def test_a_vm_holding_the_pf_keeps_it_at_unprepare_until_it_lets_go(env):
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    e.node.hold(GPU1)           # the VM's QEMU still has the PF's VFIO group open
    answer = e.driver.unprepare([ref(one)])[UIDS[0]]
    assert "GPU %s is not given back to vGPUs yet: GPU %s: still held by" % (GPU1, GPU1) in answer
    assert whole_state(e) == ("vfio-pci", 0) and e.record(UIDS[0])["devices"][0]["whole"]["step"] == "bound"
    e.reconcile()
    assert whole_state(e) == ("vfio-pci", 0)
    e.node.release(GPU1)
    assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""} and whole_state(e) == ("nvidia", 32)


@pytest.mark.parametrize("whole_first", [True, False])
def test_one_call_with_a_whole_claim_and_a_vgpu_claim_of_the_same_gpu_prepares_one_only(env, whole_first):
    """A stale allocation (the scheduler never gives both): whichever comes first in the kubelet's call is prepared,
    the other is refused naming why, and the GPU is in the first one's state."""
    one, two = claim("vm-whole", UIDS[0], [WHOLE], NODE), claim("vm-24q", UIDS[1], [D24], NODE)
    e = env(one, two)
    refs = [ref(one), ref(two)] if whole_first else [ref(two), ref(one)]
    answers = e.driver.prepare(refs)
    first, second = (UIDS[0], UIDS[1]) if whole_first else (UIDS[1], UIDS[0])
    assert answers[first].error == "" and answers[second].error and e.record(second) is None
    assert whole_state(e) == (("vfio-pci", 0) if whole_first else ("nvidia", 32))
    assert e.driver.unprepare([ref(one), ref(two)]) == {UIDS[0]: "", UIDS[1]: ""}
    assert whole_state(e) == ("nvidia", 32)


def test_a_second_whole_claim_of_a_gpu_given_whole_is_refused_naming_the_claim_that_has_it(env):
    one, two = claim("vm-whole", UIDS[0], [WHOLE], NODE), claim("vm-other", UIDS[1], [WHOLE], NODE)
    e = env(one, two)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    answer = e.driver.prepare([ref(two)])[UIDS[1]]
    assert "GPU %s cannot be given whole: it is given whole to DRA claim vms/vm-whole" % GPU1 in answer.error
    assert whole_state(e) == ("vfio-pci", 0) and e.record(UIDS[1]) is None


def test_after_a_reboot_the_boot_units_apply_without_a_declaration_leaves_the_vfs_off(env):
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    e.node.ctl("reboot")
    boot = e.make_engine()      # the boot unit: `accelops-vgpu apply`, no claim-time declaration, enable_vfs
    vgpu_apply.apply(boot, vgpu_layout.from_document(DOC, "default"), enable_vfs=True)
    assert whole_state(e) == ("nvidia", 0)


def test_a_vgpu_manager_restart_while_the_gpu_is_given_whole_changes_nothing(env):
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    e.node.ctl("manager-restart")
    result = e.reconcile()
    assert whole_state(e) == ("vfio-pci", 0) and [g for g in result["claim_time"] if g["address"] == GPU1][0][
        "held_whole"]["step"] == "bound"
    assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""} and whole_state(e) == ("nvidia", 32)


def test_a_layout_apply_that_lost_the_claim_time_record_still_leaves_a_gpu_given_whole_alone(env):
    """The modes file (claim-time-gpus.json) gone, a layout of `devices: all`: the checkpoint alone says the GPU is a
    claim's; after a reboot it is on nvidia without VFs, and the layout would have given it VFs and vGPUs."""
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    e.node.ctl("reboot")
    os.remove(e.engine.modes_file)
    everything = {"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}]}}
    result = vgpu_apply.apply(e.make_engine(), vgpu_layout.from_document(everything, "default"), enable_vfs=True)
    assert whole_state(e) == ("nvidia", 0)
    [skipped] = [s for s in result["reserved"] if s["address"] == GPU1]
    assert "given whole to DRA claim vms/vm-whole (step bound)" in skipped["reason"]


@pytest.mark.parametrize("edit", ["to-the-layout", "out-of-claim-time", "whole-gpu-off"])
def test_the_operator_editing_the_config_under_a_live_whole_claim_never_takes_the_gpu(env, edit):
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    doc = json.loads(json.dumps(DOC))
    if edit == "to-the-layout":
        doc["vgpu-configs"]["default"][0]["devices"] = [0, 1]
        del doc["claim-time"]
    elif edit == "out-of-claim-time":
        del doc["claim-time"]
    else:
        del doc["claim-time"][0]["whole-gpu"]
    e.node.clear_log()
    if edit == "whole-gpu-off":     # allowed: its device stays published while the claim has it
        result = e.reconcile(doc)
        assert {i.name for i in claim_time.offers(e.engine.sysfs, result["claim_time"])} >= {WHOLE}
    else:
        with pytest.raises(LayoutError, match="GPU %s: cannot move out of claim-time mode while it is given whole to "
                                              "DRA claim vms/vm-whole" % GPU1):
            e.reconcile(doc)
    assert whole_state(e) == ("vfio-pci", 0) and [w for w in e.node.log() if GPU1 in w["path"] + w["value"]] == []
    assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""} and whole_state(e) == ("nvidia", 32)


def test_after_a_reboot_a_pf_someone_else_bound_to_vfio_pci_is_not_taken_for_the_claims_record(env):
    """The record says the claim had the GPU whole, but a reboot put the PF back on nvidia: whoever bound it to vfio-pci
    since (the GPU Operator's vfio-manager at boot, NVIDIA's DRA driver with PassthroughSupport, whose Configure takes a
    PF already on vfio-pci as done: k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/vfio-device.go) is not this driver. The
    kubelet's prepare again is refused, its unprepare drops the record without rebinding the PF, and it stays reserved."""
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    e.node.ctl("reboot")
    e.node.bind(GPU1, "vfio-pci")       # not by us: the boot's vfio-manager, or another DRA driver
    e.driver = e.start()
    e.driver.checkpoint.boot_id = "another-boot"
    answer = e.driver.prepare([ref(one)])[UIDS[0]]
    assert "GPU %s cannot be given whole: it is bound to vfio-pci, not by this driver" % GPU1 in answer.error
    e.node.clear_log()
    assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""} and e.record(UIDS[0]) is None
    assert whole_state(e) == ("vfio-pci", 0) and [w for w in e.node.log() if w["result"] == "ok"] == []
    [gpu] = [g for g in e.reconcile()["claim_time"] if g["address"] == GPU1]
    assert "reserved" in gpu and "held_whole" not in gpu


def test_after_a_reboot_the_unprepare_of_a_claim_never_prepared_again_gives_the_vfs_back(env):
    one = claim("vm-whole", UIDS[0], [WHOLE], NODE)
    e = env(one)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    e.node.ctl("reboot")
    e.driver = e.start()
    e.driver.checkpoint.boot_id = "another-boot"
    assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""} and whole_state(e) == ("nvidia", 32)
