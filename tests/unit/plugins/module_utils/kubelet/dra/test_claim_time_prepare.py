"""NodePrepareResources of claim-time devices against gpusim (kubelet/dra/claim_time_prepare.py, driver.py):
a free VF is chosen and typed, recorded before the answer, the metadata names it; crash recovery, idempotence,
unprepare clears the type."""

import os

import pytest
from claim_data import ClaimStore, claim, ref

from ansible_collections.accelops.vgpu.plugins.module_utils.kube_errors import KubeApiError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import agent_plugin, checkpoint, claim_time, devices, metadata
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claim_time_prepare import ClaimTimePreparer
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import claim_time_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.kubelet_holders import node_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner

NODE = "gpu-node-1"
GPU1 = "0000:42:00.0"
DOC = {"version": "v1", "vgpu-configs": {"default": [{"devices": [0], "vgpu-devices": {"L40S-24Q": 2}}]},
       "claim-time": [{"devices": [1], "profiles": ["L40S-24Q", "L40S-12Q", "L40S-48Q"]}]}
D24, D12 = "l40s-24q-gpu-0000-42-00-0", "l40s-12q-gpu-0000-42-00-0"
UIDS = ["%08d-aaaa-4bbb-8ccc-000000000000" % n for n in range(1, 10)]


class Env:
    def __init__(self, node, monkeypatch, tmp_path, *claims):
        for name in ("PATH", "GPUSIM_ROOT"):
            monkeypatch.setenv(name, node.env[name])
        self.node, self.tmp = node, tmp_path
        self.kubelet = str(tmp_path / "kubelet")
        self.engine = vgpu_apply.NodeEngine(Sysfs(node.root), CommandRunner(), node.dev_root, "/proc",
                                            cache_dir=str(tmp_path), kubelet_dir=self.kubelet)
        vgpu_apply.apply(self.engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True)
        self.engine.claim_time_declaration = declaration(DOC)
        self.result = vgpu_apply.apply(self.engine, vgpu_layout.from_document(DOC, "default"))
        self.store = ClaimStore(*claims)
        self.plugin_dir, self.cdi_dir = claim_holders.plugin_dir(self.kubelet), str(tmp_path / "cdi")
        self.driver = self.start()
        node.clear_log()

    def start(self):
        sysfs = self.engine.sysfs
        driver = DraDriver(NODE, self.store.get, devices.NodeView(sysfs, lambda: facts.gather(sysfs, {})),
                           self.plugin_dir, self.cdi_dir, boot_id=self.engine.boot_id,   # this boot
                           typer=ClaimTimePreparer(sysfs, node_holders(sysfs, self.node.dev_root, "/proc",
                                                                       self.kubelet)))
        driver.typer.update(claim_time.offers(sysfs, self.result["claim_time"]))
        return driver

    def current(self, vf):
        return int(open(os.path.join(self.node.root, "bus/pci/devices", vf, "nvidia/current_vgpu_type")).read())

    def type_writes(self):
        return [(w["path"].split("/")[3], w["value"]) for w in self.node.log()
                if w["path"].endswith("current_vgpu_type")]


@pytest.fixture
def env(gpusim_node, monkeypatch, tmp_path):
    def make(*claims):
        return Env(gpusim_node("l40s:2"), monkeypatch, tmp_path, *claims)
    return make


def vf_of(answer_or_entry):
    return answer_or_entry["devices"][0]["key"]


def test_prepare_types_a_free_vf_records_it_and_the_metadata_names_it(env):
    one = claim("vm-a", UIDS[0], [D24], NODE)
    e = env(one)
    answer = e.driver.prepare([ref(one)])
    assert answer[UIDS[0]].error == "" and answer[UIDS[0]].devices[0]["device"] == D24
    entry = checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0])
    vf = vf_of(entry)
    assert entry["state"] == checkpoint.COMPLETED and entry["devices"][0]["claimTime"] is True
    assert vf.startswith("0000:42:") and e.current(vf) == 1155 and e.type_writes() == [(vf, "1155")]
    with open(metadata.file_path(e.plugin_dir, "vms", "vm-a", "gpu")) as handle:
        doc = metadata.read_stream(handle.read())[0]
    attrs = doc["requests"][0]["devices"][0]["attributes"]
    assert doc["requests"][0]["devices"][0]["name"] == D24
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": vf} and attrs["profile"] == {"string": "L40S-24Q"}
    # the same claim again: the recorded answer, no write
    e.node.clear_log()
    assert e.driver.prepare([ref(one)]) == answer and e.type_writes() == []


def test_two_claims_of_one_profile_get_two_vfs_and_unprepare_clears_each(env):
    one, two = claim("vm-a", UIDS[0], [D24], NODE), claim("vm-b", UIDS[1], [D24], NODE)
    e = env(one, two)
    e.driver.prepare([ref(one)])
    e.driver.prepare([ref(two)])
    cp = checkpoint.Checkpoint(e.plugin_dir)
    vfs = [vf_of(cp.get(UIDS[0])), vf_of(cp.get(UIDS[1]))]
    assert len(set(vfs)) == 2 and [e.current(vf) for vf in vfs] == [1155, 1155]
    assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""}
    assert e.current(vfs[0]) == 0 and e.current(vfs[1]) == 1155
    assert checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0]) is None


def test_a_vf_a_process_holds_is_never_chosen_nor_cleared(env):
    one, two = claim("vm-a", UIDS[0], [D24], NODE), claim("vm-b", UIDS[1], [D24], NODE)
    e = env(one, two)
    e.node.hold("0000:42:00.4")
    e.driver.prepare([ref(one)])
    vf = vf_of(checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0]))
    assert vf != "0000:42:00.4" and e.current("0000:42:00.4") == 0
    e.node.hold(vf)    # the VM opened its VF; the claim is unprepared while it still runs
    e.node.clear_log()
    assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""}
    assert e.current(vf) == 1155 and e.type_writes() == []


def test_a_type_the_gpu_cannot_create_now_is_that_claims_error_and_writes_nothing(env):
    one, two = claim("vm-a", UIDS[0], [D24], NODE), claim("vm-b", UIDS[1], [D12], NODE)
    e = env(one, two)
    e.driver.prepare([ref(one)])    # equal-size mode: a 12Q next to a 24Q is not creatable
    e.node.clear_log()
    answer = e.driver.prepare([ref(two)])[UIDS[1]]
    assert answer.devices == [] and answer.error.startswith(
        "claim vms/vm-b: device %s: no free VF of GPU %s can take L40S-12Q now" % (D12, GPU1))
    assert e.type_writes() == [] and checkpoint.Checkpoint(e.plugin_dir).get(UIDS[1]) is None


def test_a_failure_after_the_type_write_keeps_the_vf_recorded_the_retry_adopts_it_unprepare_clears_it(env, monkeypatch):
    one = claim("vm-a", UIDS[0], [D24], NODE)
    e = env(one)
    real_write = e.driver._write

    def broken(*dummy):
        raise OSError(28, "No space left on device", "/cdi/spec.json")
    monkeypatch.setattr(e.driver, "_write", broken)
    answer = e.driver.prepare([ref(one)])[UIDS[0]]
    assert "No space left on device" in answer.error
    [(vf, value)] = e.type_writes()
    entry = checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0])
    assert value == "1155" and entry["state"] == checkpoint.STARTED and vf_of(entry) == vf   # held: nobody retypes it
    monkeypatch.setattr(e.driver, "_write", real_write)
    e.node.clear_log()
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""          # the kubelet's retry: same VF, no write
    assert vf_of(checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0])) == vf and e.type_writes() == []
    assert e.driver.unprepare([ref(one)]) == {UIDS[0]: ""} and e.type_writes() == [(vf, "0")]


def test_a_restarted_driver_adopts_the_vf_its_started_record_names(env):
    one = claim("vm-a", UIDS[0], [D24], NODE)
    e = env(one)
    e.driver._write = None   # the first driver dies in the middle of its files: simulated below by a record
    sysfs = e.engine.sysfs
    vf = "0000:42:00.6"
    sysfs.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf, 1155)
    cp = checkpoint.Checkpoint(e.plugin_dir, "boot-1")
    cp.set(UIDS[0], "vms", "vm-a", checkpoint.STARTED, [{"requests": ["gpu"], "pool": NODE, "device": D24, "key": vf,
                                                         "typeID": 1155, "cdiIDs": [], "claimTime": True}])
    cp.save()
    e.node.clear_log()
    restarted = e.start()
    answer = restarted.prepare([ref(one)])[UIDS[0]]
    assert answer.error == ""
    assert vf_of(checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0])) == vf and e.type_writes() == []
    assert checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0])["state"] == checkpoint.COMPLETED


def test_the_reconcile_keeps_prepared_vfs_and_clears_a_type_nobody_records(env):
    one = claim("vm-a", UIDS[0], [D24], NODE)
    e = env(one)
    e.driver.prepare([ref(one)])
    vf = vf_of(checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0]))
    stray = "0000:42:00.7" if vf != "0000:42:00.7" else "0000:42:01.0"
    e.engine.sysfs.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % stray, 1155)   # crash before any record
    e.node.clear_log()
    vgpu_apply.apply(e.engine, vgpu_layout.from_document(DOC, "default"))
    assert e.type_writes() == [(stray, "0")] and e.current(vf) == 1155


def test_the_agents_preparer_needs_no_engine_reads_the_facts_once_per_prepare_and_asks_the_vf_once(env, monkeypatch):
    """Prepare gets the node's holders (kubelet_holders.node_holders: every holder source), not an engine factory:
    building a node engine while preparing fails the test; the VFs' facts are read again once per claim (forget)
    and the chosen VF is asked once, recorded already and not typed yet, right before the write."""
    one, two = claim("vm-a", UIDS[0], [D24], NODE), claim("vm-b", UIDS[1], [D24], NODE)
    e = env(one, two)
    holders = node_holders(e.engine.sysfs, e.node.dev_root, "/proc", e.kubelet)
    asked, forgotten = [], []

    def no_engine(*args, **kwargs):
        raise AssertionError("Prepare built a node engine")
    monkeypatch.setattr(vgpu_apply.NodeEngine, "__init__", no_engine)
    real, real_forget = inuse.Holders.recheck, inuse.Holders.forget

    def spy(self, names, *args, **kwargs):
        entry = claim_holders.read_claims(claim_holders.checkpoint_path(e.plugin_dir)).get(UIDS[0])
        asked.append((self is holders, list(names), entry and vf_of(entry), e.current(names[-1])))
        return real(self, names, *args, **kwargs)
    monkeypatch.setattr(inuse.Holders, "recheck", spy)
    monkeypatch.setattr(inuse.Holders, "forget", lambda self: forgotten.append(self) or real_forget(self))
    e.driver.typer = agent_plugin.claim_time_preparer(e.engine.sysfs, holders, e.kubelet)
    e.driver.typer.update(claim_time.offers(e.engine.sysfs, e.result["claim_time"]))
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    vf = vf_of(checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0]))
    assert forgotten == [holders] and asked == [(True, [vf], vf, 0)]
    assert e.type_writes() == [(vf, "1155")] and e.current(vf) == 1155
    assert e.driver.prepare([ref(two)])[UIDS[1]].error == ""     # the next claim: its facts read again, once
    assert forgotten == [holders, holders] and len(asked) == 2


def test_a_vf_held_at_the_write_is_not_written_the_next_free_vf_is_recorded_and_typed(env, monkeypatch):
    one = claim("vm-a", UIDS[0], [D24], NODE)
    e = env(one)
    first = e.node.vfs(GPU1)[0]
    real_write = e.driver.typer.write

    def opened_meanwhile(ref_, device, **kwargs):   # a VM opens the chosen VF between the choice and the write
        if device.address == first:
            e.node.hold(first)
        return real_write(ref_, device, **kwargs)
    monkeypatch.setattr(e.driver.typer, "write", opened_meanwhile)
    assert e.driver.prepare([ref(one)])[UIDS[0]].error == ""
    entry = checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0])
    vf = vf_of(entry)
    assert vf != first and entry["state"] == checkpoint.COMPLETED and len(entry["devices"]) == 1
    assert e.type_writes() == [(vf, "1155")] and e.current(first) == 0


def test_a_manager_restart_under_a_prepared_claim_gets_its_type_back_from_the_checkpoint(env):
    one, two = claim("vm-a", UIDS[0], [D24], NODE), claim("vm-b", UIDS[1], [D24], NODE)
    e = env(one, two)
    e.driver.prepare([ref(one)])
    e.driver.prepare([ref(two)])
    vfs = [vf_of(checkpoint.Checkpoint(e.plugin_dir).get(uid)) for uid in UIDS[:2]]
    e.node.ctl("manager-restart")   # refused by gpusim while a VF is open (sriov-manage -d waits for it)
    assert [e.current(vf) for vf in vfs] == [0, 0]
    e.node.hold(vfs[1])             # a process opened vm-b's VF since: nothing may write it
    e.node.clear_log()
    result = vgpu_apply.apply(e.engine, vgpu_layout.from_document(DOC, "default"))
    # the label-driven GPU 0 gets its layout back too; GPU 1 only vm-a's VF, from the checkpoint
    assert [(vf, value) for vf, value in e.type_writes() if vf.startswith("0000:42:")] == [(vfs[0], "1155")]
    assert e.current(vfs[0]) == 1155 and e.current(vfs[1]) == 0 and result["changed"]
    assert any(w.startswith("GPU %s: VF %s of DRA claim vms/vm-b lost its type 1155" % (GPU1, vfs[1]))
               for w in result["warnings"])
    e.node.clear_log()
    check = vgpu_apply.apply(e.engine, vgpu_layout.from_document(DOC, "default"), check_mode=True)
    assert e.node.log() == [] and not check["changed"]


def restarted(e, *claims):
    """The claims prepared, then a vGPU-manager restart: every VF untyped. Their VFs, in claim order."""
    for one in claims:
        assert e.driver.prepare([ref(one)])[one["metadata"]["uid"]].error == ""
    vfs = [vf_of(checkpoint.Checkpoint(e.plugin_dir).get(one["metadata"]["uid"])) for one in claims]
    e.node.ctl("manager-restart")
    assert [e.current(vf) for vf in vfs] == [0] * len(vfs)
    return vfs


def test_a_prepared_vf_whose_type_cannot_be_read_is_left_alone_with_a_warning_and_the_rest_is_restored(env):
    """After a manager restart a VF may lack its nvidia/ directory for a while (here: not bound to nvidia yet): its
    type reads as unknown, not 0. Nothing is written to it, a warning names it, the other claim gets its type."""
    one, two = claim("vm-a", UIDS[0], [D24], NODE), claim("vm-b", UIDS[1], [D24], NODE)
    e = env(one, two)
    vfs = restarted(e, one, two)
    e.node.write("bus/pci/drivers/nvidia/unbind", vfs[1])
    assert not os.path.exists(os.path.join(e.node.root, "bus/pci/devices", vfs[1], "nvidia"))
    e.node.clear_log()
    result = vgpu_apply.apply(e.engine, vgpu_layout.from_document(DOC, "default"))
    assert [(vf, value) for vf, value in e.type_writes() if vf.startswith("0000:42:")] == [(vfs[0], "1155")]
    assert not any(vfs[1] in w["path"] for w in e.node.log())
    assert ("GPU %s: VF %s of DRA claim vms/vm-b: its vGPU type cannot be read (no nvidia/ directory: the vGPU "
            "manager restarting?); not written" % (GPU1, vfs[1])) in result["warnings"]
    e.node.clear_log()
    check = vgpu_apply.apply(e.engine, vgpu_layout.from_document(DOC, "default"), check_mode=True)
    assert e.node.log() == [] and not check["changed"]


def test_a_type_that_vanishes_between_plan_and_finish_is_a_warning_not_a_failed_reconcile(env, monkeypatch):
    one = claim("vm-a", UIDS[0], [D24], NODE)
    e = env(one)
    [vf] = restarted(e, one)
    real_finish = claim_time_layout.finish

    def unbound_meanwhile(sysfs, modes, modes_file, *args):
        assert list(modes.restore) == [vf]
        e.node.write("bus/pci/drivers/nvidia/unbind", vf)
        return real_finish(sysfs, modes, modes_file, *args)
    monkeypatch.setattr(claim_time_layout, "finish", unbound_meanwhile)
    e.node.clear_log()
    result = vgpu_apply.apply(e.engine, vgpu_layout.from_document(DOC, "default"))
    assert not any(w["path"].endswith("current_vgpu_type") and vf in w["path"] for w in e.node.log())
    assert "VF %s: its vGPU type cannot be read (no nvidia/ directory: the vGPU manager restarting?); its type is " \
           "left as it is" % vf in result["warnings"]


def test_a_claim_of_an_earlier_boot_gets_no_type_back(env):
    """After a reboot the checkpoint still lists the claims of the last boot until the kubelet prepares them again
    (maybe elsewhere): their VFs are held, but their types are nobody's to restore."""
    one = claim("vm-a", UIDS[0], [D24], NODE)
    e = env(one)
    [vf] = restarted(e, one)
    e.engine.boot_id = "the-next-boot"
    e.node.clear_log()
    result = vgpu_apply.apply(e.engine, vgpu_layout.from_document(DOC, "default"))
    assert [w for w in e.node.log() if w["path"].startswith("bus/pci/devices/0000:42:")] == []
    assert e.current(vf) == 0 and not any(vf in w for w in result["warnings"])


def test_a_checkpointed_type_the_vf_cannot_create_now_is_skipped_with_one_warning(env):
    """A GPU swapped in the slot (or a mode the restart reset): the recorded type is not in the VF's creatable
    list; writing it would fail with EINVAL on every reconcile. The VF is left alone, the other claim restored."""
    one, two = claim("vm-a", UIDS[0], [D24], NODE), claim("vm-b", UIDS[1], [D24], NODE)
    e = env(one, two)
    vfs = restarted(e, one, two)
    listed = e.node.read("bus/pci/devices/%s/nvidia/creatable_vgpu_types" % vfs[1])
    foreign = max(int(line.split(":")[0]) for line in listed.splitlines()[1:]) + 1000   # another GPU's type
    cp = checkpoint.Checkpoint(e.plugin_dir)
    cp.get(UIDS[1])["devices"][0]["typeID"] = foreign
    cp.save()
    e.node.clear_log()
    result = vgpu_apply.apply(e.engine, vgpu_layout.from_document(DOC, "default"))
    assert [(vf, value) for vf, value in e.type_writes() if vf.startswith("0000:42:")] == [(vfs[0], "1155")]
    assert [w for w in result["warnings"] if vfs[1] in w] == [
        "GPU %s: VF %s of DRA claim vms/vm-b: type %d is not creatable on it now (another GPU, or a mode the restart "
        "reset?); not written" % (GPU1, vfs[1], foreign)]


def started_then_gone(e, monkeypatch, one):
    """Claim `one` left PrepareStarted on its typed VF (the files failed), then deleted from the API; its VF."""
    real_write = e.driver._write

    def broken(*dummy):
        raise OSError(28, "No space left on device", "/cdi/spec.json")
    monkeypatch.setattr(e.driver, "_write", broken)
    assert "No space" in e.driver.prepare([ref(one)])[UIDS[0]].error
    monkeypatch.setattr(e.driver, "_write", real_write)
    del e.store.objects["vms", one["metadata"]["name"]]
    entry = checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0])
    assert entry["state"] == checkpoint.STARTED and e.current(vf_of(entry)) == 1155
    e.node.clear_log()
    return vf_of(entry), entry["startedAt"]


def test_a_started_record_whose_claim_is_gone_is_cleaned_once_old_enough_and_its_vf_cleared(env, monkeypatch):
    """Issue 40.8 (NVIDIA's cmd/gpu-kubelet-plugin/cleanup.go): record, files and the claim-time type go."""
    one = claim("vm-a", UIDS[0], [D24], NODE)
    e = env(one)
    vf, started = started_then_gone(e, monkeypatch, one)
    lines, reads = [], e.store.reads
    e.driver.wall = lambda: started + 30
    assert e.driver.clean_stale(lines.append) == [] and e.store.reads == reads      # too young: not even asked
    e.driver.wall = lambda: started + 61
    assert e.driver.clean_stale(lines.append) == [UIDS[0]]
    assert checkpoint.Checkpoint(e.plugin_dir).claims == {} and e.type_writes() == [(vf, "0")]
    assert not os.path.exists(os.path.join(e.cdi_dir, "vgpu.accelops.io-claim_%s.json" % UIDS[0]))
    assert lines == ["DRA driver: claim vms/vm-a (UID %s), left PrepareStarted: not found in the API server; its "
                     "record and files removed" % UIDS[0]]


def test_a_stale_record_on_a_vf_a_process_holds_is_dropped_and_the_type_kept_naming_claim_and_vf(env, monkeypatch):
    one = claim("vm-a", UIDS[0], [D24], NODE)
    e = env(one)
    vf, started = started_then_gone(e, monkeypatch, one)
    e.node.hold(vf)
    lines = []
    e.driver.wall = lambda: started + 61
    assert e.driver.clean_stale(lines.append) == [UIDS[0]]
    assert checkpoint.Checkpoint(e.plugin_dir).claims == {} and e.current(vf) == 1155 and e.type_writes() == []
    [line] = lines
    assert line.startswith("DRA driver: claim vms/vm-a (UID %s), left PrepareStarted: not found in the API server; "
                           "its record and files removed; VF %s keeps its type: held by " % (UIDS[0], vf))


def test_clean_stale_keeps_a_record_on_an_api_error_and_completed_claims_and_drops_a_re_created_claim(env, monkeypatch):
    one, two = claim("vm-a", UIDS[0], [D24], NODE), claim("vm-b", UIDS[1], [D24], NODE)
    e = env(one, two)
    assert e.driver.prepare([ref(two)])[UIDS[1]].error == ""
    vf, started = started_then_gone(e, monkeypatch, one)
    del e.store.objects["vms", "vm-b"]          # completed, then gone: the kubelet unprepares it, not the cleanup
    e.driver.wall = lambda: started + 61
    real_get = e.driver.get_claim

    def failing(namespace, name):
        raise KubeApiError("GET resourceclaims: the server is currently unable to handle the request", 503)
    monkeypatch.setattr(e.driver, "get_claim", failing)
    lines = []
    assert e.driver.clean_stale(lines.append) == [] and sorted(checkpoint.Checkpoint(e.plugin_dir).claims) == UIDS[:2]
    assert "cannot ask the API server about it" in lines[0] and e.type_writes() == []
    e.store.objects["vms", "vm-a"] = dict(one, metadata=dict(one["metadata"], uid=UIDS[5]))   # deleted, re-created
    monkeypatch.setattr(e.driver, "get_claim", real_get)
    assert e.driver.clean_stale(lines.append) == [UIDS[0]] and e.type_writes() == [(vf, "0")]
    assert "left PrepareStarted: the API server has it under UID %s (deleted and re-created)" % UIDS[5] in lines[-1]
    assert list(checkpoint.Checkpoint(e.plugin_dir).claims) == [UIDS[1]]
