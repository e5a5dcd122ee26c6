"""The kubelet's device checkpoint as a holder source while the kubelet restarts (node/holders/kubelet_checkpoint.py).

The checksums below are the kubelet's own: GENERATED was written by the device manager's checkpoint types
(pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go) marshalled and summed with go-spew 1.1.1 as
pkg/kubelet/checkpointmanager/checksum does (nil and empty lists and maps, negative NUMA nodes, AllocResp bytes);
WRITTEN_BY_A_KUBELET is a file a running kubelet wrote (one nvidia.com/gpu device allocated)."""

from __future__ import annotations

import json
import os
import socket

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import kubelet_checkpoint, kubelet_holders

VM_POD = "0f6a2c1e-1111-4c3b-9e4f-aa00bb11cc22"
GENERATED = (
    '{"Data":{"PodDeviceEntries":[{"PodUID":"%s","ContainerName":"compute","ResourceName":'
    '"nvidia.com/NVIDIA_L40S-24Q","DeviceIDs":{"-1":["0000:42:00.4"],"0":["0000:41:00.5","0000:41:00.4"]},'
    '"AllocResp":"Ci4KBcgA/w=="},{"PodUID":"b2","ContainerName":"init","ResourceName":"devices.kubevirt.io/kvm",'
    '"DeviceIDs":{"1":["kvm1"]},"AllocResp":null},{"PodUID":"c3","ContainerName":"x","ResourceName":'
    '"nvidia.com/GH100_H100","DeviceIDs":{},"AllocResp":""}],"RegisteredDevices":{"a/empty":[],"b/nil":null,'
    '"devices.kubevirt.io/kvm":["kvm1","kvm0"],"nvidia.com/NVIDIA_L40S-24Q":["0000:41:00.4","0000:41:00.5",'
    '"0000:42:00.4"]}},"Checksum":839384629,"BootID":"1f0e-boot"}' % VM_POD)
EMPTY = '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":1944006890}'
WRITTEN_BY_A_KUBELET = (
    '{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check",'
    '"ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":'
    '"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},'
    '"Checksum":3660592824}')


def write(kubelet_dir, text):
    path = kubelet_checkpoint.checkpoint_path(str(kubelet_dir))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)
    return path


def holder(pod, container, resource):
    return kubelet_checkpoint.HOLDER % (pod, container, resource)


def test_the_kubelets_checksum_is_verified_and_its_vgpus_named(tmp_path):
    found = kubelet_checkpoint.read(write(tmp_path, GENERATED))
    vm = [holder(VM_POD, "compute", "nvidia.com/NVIDIA_L40S-24Q")]
    assert found == {"0000:41:00.4": vm, "0000:41:00.5": vm, "0000:42:00.4": vm}   # not devices.kubevirt.io's
    assert kubelet_checkpoint.read(write(tmp_path, EMPTY)) == {}
    assert kubelet_checkpoint.read(write(tmp_path, WRITTEN_BY_A_KUBELET)) == {
        "tegra": [holder("bf52b2cd-b611-4e79-86b1-280b283185c3", "check", "nvidia.com/gpu")]}
    assert kubelet_checkpoint.read(str(tmp_path / "none")) == {}


@pytest.mark.parametrize("text", [GENERATED.replace("0000:42:00.4", "0000:42:00.5", 1), GENERATED[:-1],
                                  json.dumps({"Data": {}, "Checksum": 1})])
def test_a_checkpoint_that_cannot_be_trusted_is_an_error_naming_it(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(kubelet_checkpoint.KubeletCheckpointError, match="kubelet device checkpoint %s" % path):
        kubelet_checkpoint.read(path)


def pod_resources_socket(kubelet_dir):
    path = os.path.join(str(kubelet_dir), "pod-resources", "kubelet.sock")
    os.makedirs(os.path.dirname(path))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    return server, os.stat(path).st_ctime


def test_the_kubelet_restarts_while_its_socket_is_missing_new_or_older_than_the_boot(tmp_path):
    assert kubelet_checkpoint.kubelet_restarting(str(tmp_path))                   # no socket: down
    server, made = pod_resources_socket(tmp_path)
    try:
        def restarting(age, booted_before):
            return kubelet_checkpoint.kubelet_restarting(str(tmp_path), 60, lambda: made + age,
                                                         lambda: made - booted_before)
        assert restarting(5, 3600) and not restarting(61, 3600)
        assert restarting(3600, -10)                  # made before this boot: no kubelet started since
        assert kubelet_checkpoint.boot_time() < made
    finally:
        server.close()


def test_the_checkpoint_holds_vgpus_only_while_the_kubelet_restarts(tmp_path, monkeypatch):
    write(tmp_path, GENERATED)

    def held():
        found = {}
        for source in kubelet_holders.holder_sources(str(tmp_path)):
            found.update(source())
        return found
    assert sorted(held()) == ["0000:41:00.4", "0000:41:00.5", "0000:42:00.4"]      # the kubelet is down
    server, dummy = pod_resources_socket(tmp_path)
    try:
        assert "0000:41:00.4" in held()                                             # started moments ago
        monkeypatch.setattr(kubelet_checkpoint, "RESTART_GRACE", -1.0)
        assert held() == {}       # up for longer: an entry may be a pod long gone, the allocation record answers
        write(tmp_path, "{")
        assert held() == {}
        monkeypatch.setattr(kubelet_checkpoint, "RESTART_GRACE", 60.0)
        with pytest.raises(kubelet_checkpoint.KubeletCheckpointError):              # unknown is held
            held()
    finally:
        server.close()


def test_a_checkpoint_written_this_boot_tells_a_clock_step_from_a_kubelet_not_started_since(tmp_path, monkeypatch):
    """/proc/stat's btime moves with the wall clock: an NTP step forward after the kubelet started makes its socket
    look older than the boot, which read as 'no kubelet since the boot' for the whole boot (its checkpoint, which
    keeps pods long deleted until its next allocation, held their vGPUs on every path). A checkpoint that carries
    this boot's ID (kubelets that write BootID) was written by a kubelet of this boot."""
    server, made = pod_resources_socket(tmp_path)
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("2a7c-this-boot\n")
    (proc / "stat").write_text("cpu  1 2 3\nbtime %d\n" % (made + 30))     # the clock stepped 30 s forward
    monkeypatch.setattr(kubelet_checkpoint, "RESTART_GRACE", -1.0)            # the kubelet is up for long

    def held():
        return kubelet_checkpoint.holders_source(str(tmp_path), str(proc))()
    try:
        write(tmp_path, GENERATED.replace("1f0e-boot", "2a7c-this-boot"))
        assert held() == {}
        write(tmp_path, GENERATED)                                  # written by a kubelet of an earlier boot
        assert "0000:41:00.4" in held()
        write(tmp_path, GENERATED.replace(',"BootID":"1f0e-boot"', ""))    # an older kubelet: no BootID, unsure
        assert "0000:41:00.4" in held()
    finally:
        server.close()
