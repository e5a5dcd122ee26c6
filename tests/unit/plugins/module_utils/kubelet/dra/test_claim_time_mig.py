"""MIG-backed vGPUs placed at claim time (issue 42.2) against gpusim: the DynamicMIG shape for vGPU
(kubelet/dra/claim_time_mig.py, node/claim_time_mig.py), Prepare creating the GI at the allocated placement and typing
a VF on it, each step recorded before it is taken, Unprepare destroying only what the claim created."""

import os
import random

import pytest
from claim_data import ClaimStore, claim, ref
from schemas import assert_valid

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import checkpoint, claim_time, claim_time_mig
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices, metadata, slices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claim_time_prepare import ClaimTimePreparer
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, mig, vgpu_apply, vgpu_writer
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import claim_time_mig as node_mig
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import DraAllocator, Unallocatable

NODE = "gpu-node-1"
PF = "0000:41:00.0"
PROFILES = ["H100-1-10C", "H100-1-10CME", "H100-1-20C", "H100-2-20C", "H100-3-40C", "H100-4-40C", "H100-7-80C"]
DOC = {"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {}}]},
       "claim-time": [{"devices": "all", "profiles": PROFILES}]}
UIDS = ["%08d-aaaa-4bbb-8ccc-000000000000" % n for n in range(1, 40)]
TYPE_3G = 1122


def name(profile, start, pf=PF):
    return claim_time_mig.device_name(profile, pf, start)


class Env:
    def __init__(self, node, monkeypatch, tmp_path, mig_on=True):
        for key in ("PATH", "GPUSIM_ROOT"):
            monkeypatch.setenv(key, node.env[key])
        self.node, self.tmp = node, tmp_path
        self.kubelet = str(tmp_path / "kubelet")
        self.engine = vgpu_apply.NodeEngine(Sysfs(node.root), CommandRunner(), node.dev_root, "/proc",
                                            cache_dir=str(tmp_path), kubelet_dir=self.kubelet)
        vgpu_apply.apply(self.engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True)
        if mig_on:
            for pf in node.pfs():
                node.ctl("mig", pf, "1")      # MIG mode is set beforehand (the claim-time path never toggles it)
        self.engine.claim_time_declaration = declaration(DOC)
        self.store = ClaimStore()
        self.plugin_dir, self.cdi_dir = claim_holders.plugin_dir(self.kubelet), str(tmp_path / "cdi")
        self.smi = mig.Smi(CommandRunner())
        self.offers = self.reconcile()
        self.driver = self.start()
        node.clear_log()

    def reconcile(self):
        self.result = vgpu_apply.apply(self.engine, vgpu_layout.from_document(DOC, "default"))
        return claim_time.offers(self.engine.sysfs, self.result["claim_time"])

    def start(self, boot_id=None):
        sysfs = self.engine.sysfs
        driver = DraDriver(NODE, self.store.get, devices.NodeView(sysfs, lambda: facts.gather(sysfs, {})),
                           self.plugin_dir, self.cdi_dir, boot_id=boot_id or self.engine.boot_id,
                           typer=ClaimTimePreparer(sysfs, self.engine.begin(), runner=CommandRunner()))
        driver.typer.update(self.offers)
        return driver

    def add(self, uid, *device_names):
        obj = claim("vm-%s" % uid[:8], uid, list(device_names), NODE)
        self.store.objects[("vms", obj["metadata"]["name"])] = obj
        return ref(obj)

    def gis(self, pf=PF):
        return self.smi.instances(pf)

    def current(self, vf):
        return int(open(os.path.join(self.node.root, "bus/pci/devices", vf, "nvidia/current_vgpu_type")).read())

    def record(self, uid):
        return (checkpoint.Checkpoint(self.plugin_dir).get(uid) or {}).get("devices", [{}])[0]


@pytest.fixture
def env(gpusim_node, monkeypatch, tmp_path):
    def make(spec="h100-pcie:1", **kwargs):
        return Env(gpusim_node(spec), monkeypatch, tmp_path, **kwargs)
    return make


def test_a_gpu_in_mig_mode_publishes_one_counter_set_and_one_device_per_type_and_placement(env):
    e = env()
    [counters] = [item for item in e.offers if isinstance(item, claim_time_mig.MigCounterSet)]
    assert counters.to_api()["counters"] == dict([("memory-slice-%d" % i, {"value": "1"}) for i in range(8)]
                                                 + [("compute-slices", {"value": "7"}), ("gi-profile-20", {"value": "1"})])
    placements = [item for item in e.offers if isinstance(item, claim_time_mig.PlacementDevice)]
    assert len(placements) == 7 + 7 + 4 + 3 + 2 + 1 + 1
    three = {d.name: d.to_api() for d in placements}[name("H100-3-40C", 4)]
    assert three["consumesCounters"] == [{"counterSet": "gpu-0000-41-00-0", "counters": dict(
        [("memory-slice-%d" % i, {"value": "1"}) for i in range(4, 8)] + [("compute-slices", {"value": "3"})])}]
    assert "allowMultipleAllocations" not in three and "resource.kubernetes.io/pciBusID" not in three["attributes"]
    assert (three["attributes"]["placementStart"], three["attributes"]["giProfile"]) == ({"int": 4}, {"int": 9})
    me = {d.name: d.to_api() for d in placements}[name("H100-1-10CME", 6)]
    assert me["consumesCounters"][0]["counters"]["gi-profile-20"] == {"value": "1"}


def test_a_gpu_not_in_mig_mode_offers_nothing_and_says_so(env):
    e = env(mig_on=False)
    assert e.offers == [] and any("need MIG mode, which is off" in w for w in e.result["warnings"])


def _counting(monkeypatch):
    calls, run = [], CommandRunner.run

    def counted(self, argv, check=True):
        calls.append([str(a) for a in argv])
        return run(self, argv, check)
    monkeypatch.setattr(CommandRunner, "run", counted)
    return calls


def test_prepare_creates_the_gi_at_the_placement_types_a_vf_on_it_and_unprepare_destroys_it(env, monkeypatch):
    e = env()
    one = e.add(UIDS[0], name("H100-3-40C", 0))
    calls = _counting(monkeypatch)
    answer = e.driver.prepare([one])[UIDS[0]]
    assert answer.error == ""
    # under the node lock: one -lgi (placement free?) and the create; nothing fixed (supported types, geometry) asked
    assert _smi_calls(calls) == [["mig", "-i", PF, "-lgi"], ["mig", "-i", PF, "-cgi", "9:0", "-C"]]
    [gi] = e.gis()
    record = e.record(UIDS[0])
    assert (gi.profile_id, gi.start, gi.size) == (9, 0, 4)
    assert record["mig"] == {"gpu": PF, "giProfile": 9, "start": 0, "size": 4, "before": [], "ci": True, "gi": gi.gi_id}
    vf = record["key"]
    assert e.current(vf) == TYPE_3G and node_mig.landed_on(e.engine.sysfs, vf) == gi.gi_id
    del calls[:]
    assert e.driver.unprepare([one]) == {UIDS[0]: ""}
    assert [args[3] for args in _smi_calls(calls)] == ["-lgi", "-dci", "-dgi"]
    assert e.gis() == [] and e.current(vf) == 0


def test_a_placement_an_operators_gi_overlaps_is_not_offered_refused_at_prepare_and_that_gi_never_destroyed(env):
    e = env()
    e.smi.run(PF, ["mig", "-i", PF, "-cgi", "14:2", "-C"], "operator")      # not ours: 2g at 2..3
    [theirs] = e.gis()
    offered = {item.name for item in e.reconcile()}
    assert name("H100-3-40C", 0) not in offered and name("H100-3-40C", 4) in offered
    assert name("H100-2-20C", 2) not in offered and name("H100-1-10C", 3) not in offered
    one = e.add(UIDS[0], name("H100-3-40C", 0))     # allocated before the operator's GI appeared
    answer = e.driver.prepare([one])[UIDS[0]]
    assert "placement 0:4 is taken by GPU instance %d" % theirs.gi_id in answer.error
    assert e.gis() == [theirs] and checkpoint.Checkpoint(e.plugin_dir).get(UIDS[0]) is None
    assert e.driver.unprepare([one]) == {UIDS[0]: ""} and e.gis() == [theirs]


@pytest.fixture
def no_sysfs(monkeypatch):
    monkeypatch.setattr(devices, "pcie_root", lambda sysfs, address: "pci0000:%s" % address[5:7])
    monkeypatch.setattr(devices, "numa_node", lambda sysfs, address: 0)


def test_eight_h100_fit_the_limits_and_the_slices_are_valid_against_the_schemas(no_sysfs):
    gpu = {"address": PF, "model": "H100", "vfs": 32, "profiles": [],
           "mig": {"memory_slices": 8, "compute_slices": 7, "limits": {"20": 1}}}
    shapes = [("H100-1-10C", 19, 1, 1, range(7)), ("H100-1-10CME", 20, 1, 1, range(7)),
              ("H100-1-20C", 15, 1, 2, (0, 2, 4, 6)), ("H100-2-20C", 14, 2, 2, (0, 2, 4)),
              ("H100-3-40C", 9, 3, 4, (0, 4)), ("H100-4-40C", 5, 4, 4, (0,)), ("H100-7-80C", 0, 7, 8, (0,))]
    gpu["profiles"] = [{"profile": p, "type_name": "NVIDIA " + p, "type_id": 1118 + i, "size_mib": 10240,
                        "gi_profile": g, "compute": c, "size": s, "starts": list(starts)}
                       for i, (p, g, c, s, starts) in enumerate(shapes)]
    result = [dict(gpu, address="0000:%02x:00.0" % (0x41 + n)) for n in range(8)]
    items = claim_time.offers(None, result)
    body = slices.desired_slices(NODE, items, 1)
    counters = [s["spec"]["sharedCounters"] for s in body if "sharedCounters" in s["spec"]]
    device_lists = [s["spec"]["devices"] for s in body if "devices" in s["spec"]]
    assert [len(c) for c in counters] == [8] and sum(len(d) for d in device_lists) == 8 * 25
    assert all(len(d) <= 64 for d in device_lists) and all(len(s["counters"]) <= 32 for c in counters for s in c)
    names = [d["name"] for ds in device_lists for d in ds]
    assert len(set(names)) == len(names) and all(len(n) <= 63 for n in names)
    for item in body:
        assert_valid(item)


CLASS = {"metadata": {"name": "vgpu.accelops.io"},
         "spec": {"selectors": [{"cel": {"expression": 'device.driver == "vgpu.accelops.io"'}}]}}


def mig_claim(uid, profile):
    selector = 'device.attributes["vgpu.accelops.io"].profile == "%s"' % profile
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "vm-%s" % uid[:8], "namespace": "vms", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "vgpu.accelops.io", "selectors": [{"cel": {"expression": selector}}]}}]}}}


def overlapping(gis):
    return [(a.gi_id, b.gi_id) for a in gis for b in gis
            if a.gi_id < b.gi_id and set(range(a.start, a.start + a.size)) & set(range(b.start, b.start + b.size))]


def test_the_scheduler_double_over_a_seeded_sequence_never_places_two_gis_on_one_memory_slice(env, seed=42):
    """Each allocation of the allocator double (which charges the counters) is prepared for real on gpusim."""
    e = env()
    published = slices.desired_slices(NODE, e.offers, 1)
    rng, prepared, claims, placed, refused = random.Random(seed), {}, {}, 0, 0
    for step in range(24):
        if prepared and rng.random() < 0.35:
            uid = rng.choice(sorted(prepared))
            assert e.driver.unprepare([prepared.pop(uid)]) == {uid: ""}
            del claims[("vms", "vm-%s" % uid[:8])]
            continue
        uid = UIDS[step % len(UIDS)].replace("aaaa", "%04d" % step)
        body = mig_claim(uid, rng.choice(PROFILES))
        try:
            allocation = DraAllocator([CLASS], published, claims).allocate(body, NODE)
        except Unallocatable:
            refused += 1
            continue
        body["status"] = {"allocation": allocation}
        claims[("vms", body["metadata"]["name"])] = body
        e.store.objects[("vms", body["metadata"]["name"])] = body
        answer = e.driver.prepare([ref(body)])[uid]
        assert answer.error == "", (step, answer.error)
        prepared[uid] = ref(body)
        placed += 1
        gis = e.gis()
        assert overlapping(gis) == [] and len(gis) == len(prepared)
        device = allocation["devices"]["results"][0]["device"]
        record = e.record(uid)
        [gi] = [g for g in gis if g.gi_id == record["mig"]["gi"]]
        assert device.endswith("-at-%d" % gi.start) and node_mig.landed_on(e.engine.sysfs, record["key"]) == gi.gi_id
    assert placed >= 8 and refused >= 2    # the GPU filled up: the counters, not luck, kept them apart
    for uid, claim_ref in sorted(prepared.items()):
        assert e.driver.unprepare([claim_ref]) == {uid: ""}
    assert e.gis() == []


# --- crashes: a kill -9 at each step of Prepare and Unprepare (a forked child exits at the step), then a restart ---

CRASHED = 86


def _after(monkeypatch, target, attr, when):
    """Exit the process right after `target.attr` returns when `when(*args)` says so: a crash between two steps."""
    original = getattr(target, attr)

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        if when(*args, **kwargs):
            os._exit(CRASHED)
        return result
    monkeypatch.setattr(target, attr, wrapper)


def _mig_of(saved):
    return [d.get("mig") for entry in saved.claims.values() for d in entry.get("devices") or () if d.get("mig")]


def _smi_args(args):
    return args[2] if len(args) > 2 else []


PREPARE_STEPS = {   # point -> (object, attribute, when): the step just taken when the process dies
    "recorded": (checkpoint.Checkpoint, "save", lambda cp: any("before" not in m for m in _mig_of(cp))),
    "before-noted": (checkpoint.Checkpoint, "save",
                     lambda cp: any(m.get("before") is not None and m.get("gi") is None for m in _mig_of(cp))),
    "gi-created": (mig.Smi, "run", lambda *a, **k: "-cgi" in _smi_args(a)),
    "gi-noted": (checkpoint.Checkpoint, "save", lambda cp: any(m.get("gi") for m in _mig_of(cp))),
    "typed": (vgpu_writer.VgpuWriter, "set_type", lambda *a, **k: True),
    "files-written": (metadata, "write_request", lambda *a, **k: True),
}
UNPREPARE_STEPS = {
    "cleared": (vgpu_writer.VgpuWriter, "clear_type", lambda *a, **k: True),
    "ci-destroyed": (mig.Smi, "run", lambda *a, **k: "-dci" in _smi_args(a)),
    "gi-destroyed": (mig.Smi, "run", lambda *a, **k: "-dgi" in _smi_args(a)),
}


def crash(e, monkeypatch, step, call):
    """Run `call(driver)` in a child that dies right after `step`; the parent then has the node as the crash left it."""
    pid = os.fork()
    if pid == 0:     # the child: never returns into pytest
        try:
            with monkeypatch.context() as patch:
                _after(patch, *step)
                call(e.driver)
            os._exit(0)
        except BaseException:   # pylint: disable=broad-exception-caught
            os._exit(1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == CRASHED, step
    e.driver = e.start()     # the agent restarts: a new driver on the same checkpoint


def ours(e, placement):
    return [gi for gi in e.gis() if (gi.profile_id, gi.start) == placement]


def test_a_crash_at_each_prepare_step_recovers_forward_back_or_by_stale_cleanup_and_spares_the_operators_gi(
        env, monkeypatch):
    e = env()
    e.smi.run(PF, ["mig", "-i", PF, "-cgi", "19:6", "-C"], "operator")      # not ours: 1g at 6
    [theirs] = e.gis()
    device = name("H100-3-40C", 0)
    for point, step in PREPARE_STEPS.items():
        # stale cleanup runs unprepare's release: checked where the GI exists but its ID is not recorded yet
        for path in ("forward", "back") + (("stale",) if point == "gi-created" else ()):
            uid = UIDS[0].replace("aaaa", point[:2] + path[:2])
            claim_ref = e.add(uid, device)
            crash(e, monkeypatch, step, lambda driver: driver.prepare([claim_ref]))
            if path == "forward":    # the kubelet prepares it again
                assert e.driver.prepare([claim_ref])[uid].error == "", (point, path)
                [gi] = ours(e, (9, 0))
                assert node_mig.landed_on(e.engine.sysfs, e.record(uid)["key"]) == gi.gi_id, (point, path)
                assert e.driver.unprepare([claim_ref]) == {uid: ""}
            elif path == "back":     # the kubelet unprepares it (the pod went)
                assert e.driver.unprepare([claim_ref]) == {uid: ""}, (point, path)
            else:                    # the claim is gone from the API: the stale record is cleaned
                del e.store.objects[("vms", "vm-%s" % uid[:8])]
                e.driver.clean_stale(lambda line: None, min_age=0)
            assert e.gis() == [theirs], (point, path)
            assert all(e.current(vf) == 0 for vf in e.node.vfs(PF)), (point, path)
            assert checkpoint.Checkpoint(e.plugin_dir).claims == {}, (point, path)


def test_a_crash_at_each_unprepare_step_is_finished_by_the_next_unprepare(env, monkeypatch):
    e = env()
    e.smi.run(PF, ["mig", "-i", PF, "-cgi", "19:6", "-C"], "operator")
    [theirs] = e.gis()
    for point, step in UNPREPARE_STEPS.items():
        uid = UIDS[1].replace("aaaa", point[:4])
        claim_ref = e.add(uid, name("H100-2-20C", 2))
        assert e.driver.prepare([claim_ref])[uid].error == ""
        crash(e, monkeypatch, step, lambda driver: driver.unprepare([claim_ref]))
        assert e.driver.unprepare([claim_ref]) == {uid: ""}, point
        assert e.gis() == [theirs] and all(e.current(vf) == 0 for vf in e.node.vfs(PF)), point


def test_a_vgpu_the_driver_puts_on_a_gi_we_did_not_create_is_cleared_and_that_gi_kept(env):
    e = env()
    e.smi.run(PF, ["mig", "-i", PF, "-cgi", "9:4", "-C"], "operator")      # a free 3g of the same profile, not ours
    [theirs] = e.gis()
    one = e.add(UIDS[2], name("H100-3-40C", 0))
    answer = e.driver.prepare([one])[UIDS[2]]
    assert "landed on GPU instance %d, not on GPU instance" % theirs.gi_id in answer.error
    assert e.gis() == [theirs] and all(e.current(vf) == 0 for vf in e.node.vfs(PF))
    assert checkpoint.Checkpoint(e.plugin_dir).claims == {}


def test_after_a_reboot_a_gi_at_the_claims_old_placement_and_id_is_not_adopted_nor_destroyed(env):
    e = env()
    one = e.add(UIDS[3], name("H100-3-40C", 0))
    assert e.driver.prepare([one])[UIDS[3]].error == ""
    [old] = e.gis()
    e.node.ctl("reboot")     # GIs, VFs and MIG mode are gone; the kubelet prepares its claims again
    vgpu_apply.apply(e.engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True)
    e.node.ctl("mig", PF, "1")
    e.smi.run(PF, ["mig", "-i", PF, "-cgi", "9:0", "-C"], "operator")    # same profile, placement and ID as ours was
    [theirs] = e.gis()
    assert (theirs.gi_id, theirs.start) == (old.gi_id, old.start)
    e.driver = e.start(boot_id="the-next-boot")
    assert "placement 0:4 is taken by GPU instance %d" % theirs.gi_id in e.driver.prepare([one])[UIDS[3]].error
    assert e.driver.unprepare([one]) == {UIDS[3]: ""} and e.gis() == [theirs]


def test_a_mig_gpu_whose_placements_are_all_taken_is_still_known_as_claim_time_by_its_counter_set(no_sysfs):
    gpu = {"address": PF, "model": "H100", "vfs": 32, "mig": {"memory_slices": 8, "compute_slices": 0, "limits": {}},
           "profiles": [{"profile": "H100-7-80C", "type_name": "NVIDIA H100-7-80C", "type_id": 1124,
                         "size_mib": 81920, "gi_profile": 0, "compute": 7, "size": 8, "starts": []}]}
    items = claim_time.offers(None, [gpu])
    assert [type(i).__name__ for i in items] == ["MigCounterSet"] and claim_time.gpus_of(items) == {PF}


def test_the_node_cli_says_what_a_mig_claim_time_gpu_offers(env, capsys):
    from ansible_collections.accelops.vgpu.plugins.module_utils import node_cli   # pylint: disable=import-outside-toplevel
    e = env()
    node_cli._print_apply(e.result, True)    # pylint: disable=protected-access
    out = capsys.readouterr().out
    assert "offers H100-1-10C (up to 7), H100-1-10CME (up to 1), H100-1-20C (up to 4)" in out


def test_after_a_reboot_an_operators_gi_where_a_claim_of_the_old_boot_had_its_gi_is_foreign_in_the_offers(env):
    """Before the kubelet prepares the old boot's claim again, its record must not make the operator's GI (same
    profile, placement and ID) look ours: that placement is not offered and its compute slices are taken."""
    e = env()
    one = e.add(UIDS[4], name("H100-3-40C", 0))
    assert e.driver.prepare([one])[UIDS[4]].error == ""
    [old] = e.gis()
    e.node.ctl("reboot")
    e.engine.boot_id = "the-next-boot"
    vgpu_apply.apply(e.engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True)
    e.node.ctl("mig", PF, "1")
    e.smi.run(PF, ["mig", "-i", PF, "-cgi", "9:0", "-C"], "operator")
    assert [(gi.gi_id, gi.start) for gi in e.gis()] == [(old.gi_id, old.start)]
    offered = {item.name: item for item in e.reconcile()}
    assert name("H100-3-40C", 0) not in offered and name("H100-1-10C", 0) not in offered
    assert offered["gpu-0000-41-00-0"].compute_slices == 4


def _dgi_fails_once(monkeypatch):
    run, failed = mig.Smi.run, []

    def dgi_fails_once(self, pf, args, what, ok_codes=(0,)):
        if "-dgi" in args and not failed:
            failed.append(args)
            raise vgpu_layout.LayoutError("GPU %s: nvidia-smi %s failed: In use by another client" % (pf, what))
        return run(self, pf, args, what, ok_codes)
    monkeypatch.setattr(mig.Smi, "run", dgi_fails_once)
    return failed


def test_a_failed_prepare_whose_gi_cannot_be_destroyed_keeps_its_record_so_the_gi_stays_ours(env, monkeypatch):
    """The vGPU landed on an operator's GI (the claim fails) and `-dgi` of the claim's own GI fails once: the record
    must stay, else that GI reads as foreign for ever (never offered, never destroyed); the unprepare destroys it."""
    e = env()
    e.smi.run(PF, ["mig", "-i", PF, "-cgi", "9:4", "-C"], "operator")
    [theirs] = e.gis()
    failed = _dgi_fails_once(monkeypatch)
    one = e.add(UIDS[5], name("H100-3-40C", 0))
    assert "landed on GPU instance %d" % theirs.gi_id in e.driver.prepare([one])[UIDS[5]].error
    [mine] = [gi for gi in e.gis() if gi != theirs]
    assert failed and e.record(UIDS[5])["mig"]["gi"] == mine.gi_id
    assert name("H100-3-40C", 0) in {item.name for item in e.reconcile()}     # still ours: its placement offered
    del e.store.objects[("vms", "vm-%s" % UIDS[5][:8])]       # the claim is gone: the stale cleanup destroys it
    failed[:] = []
    assert e.driver.clean_stale(lambda line: None, min_age=0) == [] and e.record(UIDS[5])["mig"]["gi"] == mine.gi_id
    assert e.driver.clean_stale(lambda line: None, min_age=0) == [UIDS[5]] and e.gis() == [theirs]


def test_a_vgpu_manager_restart_never_gives_a_mig_backed_claim_its_type_back_on_a_gi_it_did_not_create(env):
    """The restart takes the claim's GI and its VF's type; a free GI of the same profile (the operator's here) makes
    the type creatable again, and the driver would put the restored vGPU on that GI: the restore must not write it."""
    e = env()
    one = e.add(UIDS[6], name("H100-1-10C", 0))
    assert e.driver.prepare([one])[UIDS[6]].error == ""
    vf = e.record(UIDS[6])["key"]
    e.node.ctl("manager-restart")
    e.smi.run(PF, ["mig", "-i", PF, "-cgi", "19:3", "-C"], "operator")
    [theirs] = e.gis()
    e.reconcile()
    assert e.current(vf) == 0 and e.gis() == [theirs]
    assert any(vf in w and "MIG-backed" in w for w in e.result["warnings"]), e.result["warnings"]


def test_an_unprepare_whose_gi_cannot_be_destroyed_fails_and_keeps_its_record_for_the_retry(env, monkeypatch):
    e = env()
    one = e.add(UIDS[7], name("H100-2-20C", 2))
    assert e.driver.prepare([one])[UIDS[7]].error == ""
    [mine] = e.gis()
    vf = e.record(UIDS[7])["key"]
    _dgi_fails_once(monkeypatch)
    error = e.driver.unprepare([one])[UIDS[7]]
    assert "GPU instance %d" % mine.gi_id in error and "In use by another client" in error
    assert e.gis() == [mine] and e.record(UIDS[7])["mig"]["gi"] == mine.gi_id and e.current(vf) == 0
    assert e.driver.unprepare([one]) == {UIDS[7]: ""} and e.gis() == []
    assert checkpoint.Checkpoint(e.plugin_dir).claims == {}


def _smi_calls(calls):
    return [argv[1:] for argv in calls if os.path.basename(argv[0]) == "nvidia-smi"]


def test_an_agent_reconcile_of_an_unchanged_mig_claim_time_node_asks_nvidia_smi_only_for_mode_and_instances(
        env, monkeypatch, tmp_path):
    """The agent builds a node engine per reconcile, under the node lock; -lgipp, -lgip and `vgpu -s -v` answer the
    same while the driver stays loaded, so only the first reconcile asks them (MIG mode and -lgi every time)."""
    import argparse  # pylint: disable=import-outside-toplevel
    from ansible_collections.accelops.vgpu.plugins.module_utils.agent import agent as agent_module
    from ansible_collections.accelops.vgpu.plugins.module_utils.agent import settings as agent_settings
    e = env("h100-pcie:3")
    calls = _counting(monkeypatch)
    settings = agent_settings.resolve(argparse.Namespace(), dict(
        NODE_NAME=NODE, DEFAULT_VGPU_CONFIG="default", CONFIG_FILE=str(tmp_path / "config.yaml"), NAMESPACE="vgpu",
        ACCELOPS_VGPU_SYSFS_ROOT=e.node.root, ACCELOPS_VGPU_DEV_ROOT=e.node.dev_root, ACCELOPS_VGPU_PROC_ROOT="/proc",
        STATUS_FILE=str(tmp_path / "status.json"), KUBELET_DIR=e.kubelet))
    agent = agent_module.Agent(settings, None, "vgpu")
    per_reconcile = []
    for dummy in range(2):
        del calls[:]
        result = vgpu_apply.apply(agent.engine(declaration(DOC)), vgpu_layout.from_document(DOC, "default"))
        assert len(result["claim_time"]) == 3 and all(g["profiles"] for g in result["claim_time"])
        per_reconcile.append(_smi_calls(calls))
    first, second = per_reconcile
    assert len(first) == 5 * 3, first     # mode, -lgi, `vgpu -s -v`, -lgipp, -lgip: each once per GPU
    asked = sorted(" ".join(a for a in args if a not in e.node.pfs()) for args in second)
    assert asked == sorted(["-i --query-gpu=mig.mode.current --format=csv,noheader", "mig -i -lgi"] * 3), second
    e.node.ctl("driver", "unload")
    e.node.ctl("driver", "load", "580.2")     # a reload may change what the GPU supports: asked again
    del calls[:]
    vgpu_apply.apply(agent.engine(declaration(DOC)), vgpu_layout.from_document(DOC, "default"), enable_vfs=True)
    assert any(args[:1] == ["vgpu"] for args in _smi_calls(calls)) and any("-lgipp" in a for a in _smi_calls(calls))
