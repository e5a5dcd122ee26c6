import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from claim_data import ClaimStore, claim, ref
from dra_node import A16_UUID, build, view
from schemas import assert_valid

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import checkpoint, metadata
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, node_lock
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import agent_plugin
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import driver as driver_module
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.health import device_health

NODE = "gpu-node-1"
POOL = NODE + "/vgpu.accelops.io"     # slices.pool_name
VF4, VF5 = "l40s-24q-0000-41-00-4", "l40s-24q-0000-41-00-5"
A16_DEVICE = "a2-1b-" + A16_UUID
UID1, UID2, UID3 = "11111111-aaaa-4bbb-8ccc-000000000001", "22222222-aaaa-4bbb-8ccc-000000000002", \
    "33333333-aaaa-4bbb-8ccc-000000000003"


class Env:
    def __init__(self, tmp_path, *claims, boot_id="boot-1"):
        self.node = build(tmp_path / "node")
        self.store = ClaimStore(*claims)
        self.plugin_dir, self.cdi_dir = str(tmp_path / "plugins" / "vgpu.accelops.io"), str(tmp_path / "cdi")
        self.boot_id = boot_id
        self.driver = self.start()

    def start(self, boot_id=None, **kwargs):
        """A (re)started driver on the same node, directories and API."""
        return DraDriver(NODE, self.store.get, view(self.node), self.plugin_dir, self.cdi_dir,
                         boot_id=boot_id or self.boot_id, **kwargs)

    def files(self):
        found = []
        for base in (self.plugin_dir, self.cdi_dir):
            for root, dummy, names in os.walk(base):
                found += [os.path.relpath(os.path.join(root, n), base) for n in names if n != "checkpoint.json"]
        return sorted(found)

    def json(self, *parts):
        with open(os.path.join(*parts)) as handle:
            return json.load(handle)


@pytest.mark.parametrize("pool", [POOL, NODE])
def test_prepare_writes_the_cdi_spec_and_kep5304_metadata_and_returns_their_ids(tmp_path, pool):
    """`<node>/vgpu.accelops.io`, and the node's name: a claim allocated before issue 40 renamed the pool is prepared
    (and unprepared) the same way, its answer, metadata and health naming the pool it was allocated from."""
    one = claim("vm-a-gpu", UID1, [VF4], NODE, pool=pool)
    assert_valid(one)
    env = Env(tmp_path, one)
    result = env.driver.prepare([ref(one)])
    assert result == {UID1: (
        [{"requests": ["gpu"], "pool": pool, "device": VF4,
          "cdiIDs": ["vgpu.accelops.io/claim=%s-%s" % (UID1, VF4), "vgpu.accelops.io/metadata=%s_gpu" % UID1]}], "")}
    node = env.node
    spec = env.json(env.cdi_dir, "vgpu.accelops.io-claim_%s.json" % UID1)
    assert spec == {"cdiVersion": "0.5.0", "kind": "vgpu.accelops.io/claim", "devices": [
        {"name": "%s-%s" % (UID1, VF4), "containerEdits": {"deviceNodes": [
            {"path": "/dev/vfio/vfio", "permissions": "rw"},
            {"path": "/dev/vfio/%s" % node.group_of("0000:41:00.4"), "permissions": "rw"},
            {"path": "/dev/vfio/devices/vfio1", "permissions": "rw"}]}}]}
    host_file = os.path.join(env.plugin_dir, "dra-device-metadata", "vms_vm-a-gpu", "gpu", "metadata.json")
    mount = env.json(env.cdi_dir, "vgpu.accelops.io_metadata_%s_gpu.json" % UID1)
    assert mount == {"cdiVersion": "0.5.0", "kind": "vgpu.accelops.io/metadata", "devices": [
        {"name": "%s_gpu" % UID1, "containerEdits": {"mounts": [{
            "hostPath": host_file, "options": ["ro", "bind"],
            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-a-gpu/gpu/"
                             "vgpu.accelops.io-metadata.json"}]}}]}
    with open(host_file) as handle:
        stream = metadata.read_stream(handle.read())
    assert [(obj["apiVersion"], obj["kind"]) for obj in stream] == [("metadata.resource.k8s.io/v1alpha1", "DeviceMetadata")]
    doc = stream[0]
    assert doc["metadata"] == {"name": "vm-a-gpu", "namespace": "vms", "uid": UID1, "generation": 1}
    assert "podClaimName" not in doc
    [request] = doc["requests"]
    assert request["name"] == "gpu" and [(d["driver"], d["pool"], d["name"]) for d in request["devices"]] == [
        ("vgpu.accelops.io", pool, VF4)]
    attributes = request["devices"][0]["attributes"]
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:41:00.4"}   # what KubeVirt attaches
    assert "mdevUUID" not in attributes and attributes["profile"] == {"string": "L40S-24Q"}
    current = [d for d in env.driver.node_view.devices() if d.name != VF4]    # the claim's vGPU lost its type
    health = {(h.pool, h.device): h.healthy
              for h in device_health(current, env.driver.prepared_claims(), POOL, env.driver.pools)}
    assert health[pool, VF4] is False and health[POOL, VF5] is True
    assert env.driver.unprepare([ref(one)]) == {UID1: ""} and env.files() == []


def test_an_mdev_claim_gives_kubevirt_the_uuid_and_a_template_claim_the_pod_claim_path(tmp_path):
    one = claim("vm-b-gpu-x7k2p", UID2, [A16_DEVICE], NODE,
                annotations={"resource.kubernetes.io/pod-claim-name": "vgpu"})
    env = Env(tmp_path, one)
    assert env.driver.prepare([ref(one)])[UID2].error == ""
    mount = env.json(env.cdi_dir, "vgpu.accelops.io_metadata_%s_gpu.json" % UID2)["devices"][0]["containerEdits"]
    assert mount["mounts"][0]["containerPath"] == \
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/vgpu/gpu/vgpu.accelops.io-metadata.json"
    with open(mount["mounts"][0]["hostPath"]) as handle:
        doc = metadata.read_stream(handle.read())[0]
    assert doc["podClaimName"] == "vgpu"
    attributes = doc["requests"][0]["devices"][0]["attributes"]
    assert attributes["mdevUUID"] == {"string": A16_UUID}
    spec = env.json(env.cdi_dir, "vgpu.accelops.io-claim_%s.json" % UID2)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][1] == {
        "path": "/dev/vfio/%s" % env.node.group_of(A16_UUID, "bus/mdev/devices"), "permissions": "rw"}


def test_prepare_again_answers_the_same_without_asking_the_api(tmp_path):
    one = claim("vm-a-gpu", UID1, [VF4], NODE)
    env = Env(tmp_path, one)
    first = env.driver.prepare([ref(one)])
    files = env.files()
    assert env.store.reads == 1
    assert env.driver.prepare([ref(one)]) == first and env.start().prepare([ref(one)]) == first
    assert env.store.reads == 1 and env.files() == files


def test_before_its_first_inventory_a_driver_answers_prepared_claims_and_new_ones_wait_or_hear_it_is_starting(
        tmp_path):
    """Issue 40.1: a restarted agent's driver (ready=False) answers a claim prepared this boot from the checkpoint at
    once; a new claim waits for inventory_known() (bounded by READY_WAIT) or gets an error saying it is starting."""
    done, new = claim("vm-a-gpu", UID1, [VF4], NODE), claim("vm-b-gpu", UID2, [VF5], NODE)
    env = Env(tmp_path, done, new)
    first = env.driver.prepare([ref(done)])
    starting = env.start(ready=False, ready_wait=0.2)
    began = time.monotonic()
    result = starting.prepare([ref(done), ref(new)])
    assert result[UID1] == first[UID1] and env.store.reads == 1      # no wait, no API read
    assert result[UID2] == ([], "claim vms/vm-b-gpu: not prepared: the DRA driver on node gpu-node-1 is starting (it "
                                "knows its devices after its first reconcile; waited 0.2 s); the kubelet retries")
    assert 0.2 <= time.monotonic() - began < 2 and checkpoint.Checkpoint(env.plugin_dir).get(UID2) is None
    waiting = env.start(ready=False, ready_wait=5.0)
    threading.Timer(0.2, waiting.inventory_known).start()            # the first reconcile ends meanwhile
    assert waiting.prepare([ref(new)])[UID2].error == ""


def test_each_claim_gets_its_own_error_and_the_others_are_prepared(tmp_path):
    good = claim("good", UID1, [VF4], NODE)
    stale = claim("stale", UID2, ["l40s-48q-0000-41-00-5"], NODE)      # allocated before a retype
    recreated = claim("recreated", "99999999-0000-4000-8000-000000000009", [VF5], NODE)
    env = Env(tmp_path, good, stale, recreated)
    missing = ref(claim("missing", UID3, [VF5], NODE))
    asked = [ref(good), ref(stale), missing, ref(recreated)._replace(uid="44444444-0000-4000-8000-000000000004")]
    result = env.driver.prepare(asked)
    assert sorted(result) == sorted(r.uid for r in asked)                # every claim gets an answer
    assert result[UID1].error == "" and result[UID1].devices
    assert result[UID2] == ([], "claim vms/stale: device l40s-48q-0000-41-00-5 (request gpu) is not on node "
                                "gpu-node-1: its vGPU was retyped or removed after it was allocated")
    assert result[UID3] == ([], "claim vms/missing: not found in the API server")
    assert result["44444444-0000-4000-8000-000000000004"].error == (
        "claim vms/recreated: its UID is 99999999-0000-4000-8000-000000000009, the kubelet asked for "
        "44444444-0000-4000-8000-000000000004 (the claim was deleted and re-created)")
    assert env.driver.holders() == {"0000:41:00.4": ["DRA claim vms/good"]}
    assert not any(UID2 in name or UID3 in name for name in env.files())


def test_a_device_of_another_pool_or_another_prepared_claim_is_refused(tmp_path):
    first = claim("first", UID1, [VF4], NODE)
    second = claim("second", UID2, [VF4], NODE)
    foreign = claim("foreign", UID3, [VF5], "other-node")
    env = Env(tmp_path, first, second, foreign)
    env.driver.prepare([ref(first)])
    result = env.driver.prepare([ref(second), ref(foreign)])
    assert result[UID2].error == "claim vms/second: device %s is prepared for DRA claim vms/first" % VF4
    assert result[UID3].error == ("claim vms/foreign: device other-node/vgpu.accelops.io/%s is not in this "
                                  "node's pool (gpu-node-1/vgpu.accelops.io)" % VF5)


def test_results_of_other_drivers_are_left_to_them(tmp_path):
    one = claim("mixed", UID1, [VF4], NODE, other_driver="nic.example.com")
    env = Env(tmp_path, one)
    assert [d["device"] for d in env.driver.prepare([ref(one)])[UID1].devices] == [VF4]


def test_unprepare_removes_every_file_and_the_hold_and_is_idempotent(tmp_path):
    one, two = claim("vm-a-gpu", UID1, [VF4], NODE), claim("vm-b-gpu", UID2, [VF5], NODE)
    env = Env(tmp_path, one, two)
    env.driver.prepare([ref(one), ref(two)])
    assert env.driver.unprepare([ref(one)]) == {UID1: ""}
    assert not any(UID1 in name or "vm-a-gpu" in name for name in env.files())
    assert env.driver.holders() == {"0000:41:00.5": ["DRA claim vms/vm-b-gpu"]}
    assert env.driver.unprepare([ref(one)]) == {UID1: ""} and env.start().unprepare([ref(one)]) == {UID1: ""}
    assert claim_holders.holders_of(env.plugin_dir) == {"0000:41:00.5": ["DRA claim vms/vm-b-gpu"]}


def test_a_reboot_prepares_again_from_the_api(tmp_path):
    one = claim("vm-a-gpu", UID1, [VF4], NODE)
    env = Env(tmp_path, one)
    first = env.driver.prepare([ref(one)])
    assert env.start(boot_id="boot-2").prepare([ref(one)]) == first
    assert env.store.reads == 2


def test_lost_files_are_written_again(tmp_path):
    one = claim("vm-a-gpu", UID1, [VF4], NODE)
    env = Env(tmp_path, one)
    env.driver.prepare([ref(one)])
    os.unlink(os.path.join(env.cdi_dir, "vgpu.accelops.io-claim_%s.json" % UID1))
    env.driver.prepare([ref(one)])
    assert os.path.exists(os.path.join(env.cdi_dir, "vgpu.accelops.io-claim_%s.json" % UID1))


def test_a_damaged_checkpoint_is_an_error_naming_it(tmp_path):
    one = claim("vm-a-gpu", UID1, [VF4], NODE)
    env = Env(tmp_path, one)
    env.driver.prepare([ref(one)])
    path = os.path.join(env.plugin_dir, "checkpoint.json")
    with open(path) as handle:
        doc = json.load(handle)
    doc["claims"][UID1]["devices"] = []
    with open(path, "w") as handle:
        json.dump(doc, handle)
    with pytest.raises(claim_holders.CheckpointError, match="checkpoint %s: checksum mismatch" % path):
        env.start()


CRASH = r"""
import os, signal, sys
sys.path[:0] = %(path)r
from test_driver import Env, claim, ref, NODE, VF4, UID1
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import metadata
import pathlib
env = Env.__new__(Env)
env.node = __import__("dra_node").FakeNode(pathlib.Path(%(node)r))
env.store = __import__("claim_data").ClaimStore(claim("vm-a-gpu", UID1, [VF4], NODE))
env.plugin_dir, env.cdi_dir, env.boot_id = %(plugin)r, %(cdi)r, "boot-1"
if %(midway)r:   # killed after the CDI spec, before the metadata files
    metadata.write_request = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
env.start().prepare([ref(claim("vm-a-gpu", UID1, [VF4], NODE))])
os.kill(os.getpid(), signal.SIGKILL)   # the answer never reaches the kubelet
"""


@pytest.mark.parametrize("midway", [False, True], ids=["after-the-writes", "between-the-writes"])
def test_kill_9_then_restart_prepares_and_unprepares(tmp_path, midway):
    one = claim("vm-a-gpu", UID1, [VF4], NODE)
    env = Env(tmp_path, one)
    script = CRASH % {"path": [os.path.dirname(__file__)] + sys.path, "node": str(tmp_path / "node"),
                      "plugin": env.plugin_dir, "cdi": env.cdi_dir, "midway": midway}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    state = checkpoint.Checkpoint(env.plugin_dir).get(UID1)["state"]
    assert state == (checkpoint.STARTED if midway else checkpoint.COMPLETED)
    assert env.start().holders() == {"0000:41:00.4": ["DRA claim vms/vm-a-gpu"]}   # held across the crash
    assert env.start().unprepare([ref(one)]) == {UID1: ""}
    assert env.files() == [] and env.start().holders() == {}
    result = env.start().prepare([ref(one)])[UID1]
    assert result.error == "" and len(env.files()) == 3


@pytest.mark.parametrize("content", ["", '{"checksum":"ab12","claims":{"11111111-aaaa'], ids=["empty", "torn"])
def test_an_empty_or_torn_checkpoint_is_one_line_naming_the_file_and_what_to_do(tmp_path, content):
    one = claim("vm-a-gpu", UID1, [VF4], NODE)
    env = Env(tmp_path, one)
    env.driver.prepare([ref(one)])
    path = os.path.join(env.plugin_dir, "checkpoint.json")
    with open(path, "w") as handle:
        handle.write(content)       # what a rename without fsync leaves after a power loss
    for call in (env.start, claim_holders.holders_source(str(tmp_path), claim_holders.DRIVER)):
        with pytest.raises(claim_holders.CheckpointError) as failed:
            call()
        message = str(failed.value)
        assert "\n" not in message and path in message and "empty or cut short" in message
        assert "drain the node's pods that use vGPU claims, then move the file away and restart the agent" in message


def test_every_checkpoint_record_is_on_disk_before_the_next_step(tmp_path, monkeypatch):
    """A power loss right after the PrepareStarted record (or any other) keeps it: the file's content and the
    directory entry (the rename) are fsynced before prepare goes on to write the CDI spec."""
    one = claim("vm-a-gpu", UID1, [VF4], NODE)
    env = Env(tmp_path, one)
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink("/proc/self/fd/%d" % fd))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    at_cdi_write = []
    real_write_spec = driver_module.cdi.write_claim_spec

    def write_claim_spec(*args, **kwargs):
        at_cdi_write.append(list(synced))
        return real_write_spec(*args, **kwargs)

    monkeypatch.setattr(driver_module.cdi, "write_claim_spec", write_claim_spec)
    assert env.driver.prepare([ref(one)])[UID1].error == ""
    [before_cdi] = at_cdi_write
    assert os.path.realpath(env.plugin_dir) in before_cdi                          # the directory (the rename)
    assert any(os.path.basename(p).startswith(".checkpoint.json.") for p in before_cdi)   # the content
    with open(os.path.join(env.plugin_dir, "checkpoint.json")) as handle:
        assert json.load(handle)["claims"][UID1]["state"] == checkpoint.COMPLETED
    del synced[:]
    assert env.driver.unprepare([ref(one)]) == {UID1: ""}
    assert os.path.realpath(env.plugin_dir) in synced


HOLD_LOCK = """
import fcntl, os, sys
handle = open(sys.argv[1], "a+")
fcntl.flock(handle, fcntl.LOCK_EX)       # as node_lock takes it: an apply of the boot unit, a module, the CLI
handle.write("%d\\n" % os.getpid())
handle.flush()
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def lock_holder(tmp_path):
    """start() -> another process holds the node lock until the test ends."""
    procs = []

    def start(path):
        proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        proc.stdin.close()
        proc.wait(timeout=10)


def test_a_prepare_waiting_for_the_node_lock_gives_up_in_time_and_never_holds_up_unprepare(tmp_path, lock_holder):
    one, two, three = (claim("vm-a-gpu", UID1, [VF4], NODE), claim("vm-b-gpu", UID2, [VF5], NODE),
                       claim("vm-c-gpu", UID3, [A16_DEVICE], NODE))
    env = Env(tmp_path, one, two, three)
    locks = str(tmp_path / "locks")
    os.makedirs(locks)
    driver = env.start(node_lock=lambda timeout: node_lock.node_lock(env.node.sys, timeout, directory=locks),
                       lock_wait=1.5, call_budget=2.5)
    assert driver.prepare([ref(two)])[UID2].error == ""
    path = node_lock.lock_path(env.node.sys, locks)
    holder = lock_holder(path)

    answers = {}
    started = time.monotonic()
    waiting = threading.Thread(target=lambda: answers.update(driver.prepare([ref(one), ref(three)])))
    waiting.start()
    time.sleep(0.3)
    assert "an earlier call is still preparing it" in driver.prepare([ref(one)])[UID1].error   # a kubelet retry
    before = time.monotonic()
    assert driver.unprepare([ref(two)]) == {UID2: ""}         # not queued behind the waiting prepare
    assert time.monotonic() - before < 0.5
    waiting.join(timeout=10)
    assert not waiting.is_alive()
    assert time.monotonic() - started < 2.5 + 1.0             # the call's budget, not the lock's 300 s
    assert "not prepared within 2 s" in answers[UID1].error and path in answers[UID1].error
    assert "(pid %d)" % holder.pid in answers[UID1].error and "the kubelet retries" in answers[UID1].error
    assert answers[UID3].error and "the kubelet retries" in answers[UID3].error   # what was left of the budget
    assert driver.holders() == {} and env.files() == []       # nothing recorded or written for them

    holder.stdin.close()
    holder.wait(timeout=10)
    assert driver.prepare([ref(one)])[UID1].error == ""      # the kubelet's retry, once the apply is done
    # the defaults: a call's waits plus one API read stay well under the kubelet's 45 s
    assert driver_module.LOCK_WAIT <= driver_module.CALL_BUDGET and \
        driver_module.CALL_BUDGET + agent_plugin.CLAIM_READ_TIMEOUT <= 35


def test_an_unprepare_between_the_reserve_and_the_files_is_not_undone_by_the_prepare(tmp_path):
    """The kubelet gave up on a Prepare (45 s) and unprepared the claim while that Prepare still ran: the
    Prepare, past its reserve step, must not write the files and record the claim COMPLETED again."""
    one = claim("vm-a-gpu", UID1, [VF4], NODE)
    env = Env(tmp_path, one)
    driver = env.driver
    reserve = driver._reserve

    def reserve_then_unprepared(*args):
        entries = reserve(*args)
        assert driver.unprepare([ref(one)]) == {UID1: ""}
        return entries
    driver._reserve = reserve_then_unprepared
    answer = driver.prepare([ref(one)])[UID1]
    assert "unprepared while this call prepared it" in answer.error and answer.devices == []
    assert driver.holders() == {} and env.files() == []
    driver._reserve = reserve
    assert driver.prepare([ref(one)])[UID1].error == ""            # the kubelet's next Prepare works
