import argparse

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import settings
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import node_lock


def parse(argv):
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return parser.parse_args(argv)


REQUIRED = {"NODE_NAME": "gpu-a", "CONFIG_FILE": "/etc/vgpu/config.yaml", "DEFAULT_VGPU_CONFIG": "default"}


def test_vdm_variables_roots_from_host_root_mount_and_the_lock_named_after_the_hosts_sys(tmp_path):
    (tmp_path / "sys").mkdir()
    got = settings.resolve(parse([]), dict(REQUIRED, HOST_ROOT_MOUNT=str(tmp_path), NAMESPACE="gpu"))
    assert (got.node_name, got.config_file, got.default_vgpu_config, got.namespace) == (
        "gpu-a", "/etc/vgpu/config.yaml", "default", "gpu")
    assert (got.sysfs_root, got.dev_root, got.proc_root) == (
        str(tmp_path / "sys"), str(tmp_path / "dev"), str(tmp_path / "proc"))
    assert got.lock_key == "/sys"
    assert (got.resync_interval, got.watch_timeout, got.mixed_size) == (300.0, 300.0, False)


def test_flags_win_over_variables_and_an_explicit_sysfs_root_names_its_own_lock(tmp_path):
    got = settings.resolve(parse(["--node-name", "gpu-b", "--sysfs-root", str(tmp_path), "--mixed-size",
                                  "--resync-interval", "2.5"]), dict(REQUIRED, RESYNC_INTERVAL="60"))
    assert (got.node_name, got.sysfs_root, got.lock_key, got.mixed_size, got.resync_interval) == (
        "gpu-b", str(tmp_path), None, True, 2.5)


@pytest.mark.parametrize("env, message", [
    ({"NODE_NAME": ""}, "NODE_NAME is required"),
    ({"DEFAULT_VGPU_CONFIG": ""}, "DEFAULT_VGPU_CONFIG is required"),
    ({"RESYNC_INTERVAL": "soon"}, "RESYNC_INTERVAL='soon' is not a positive number of seconds"),
    ({"MIXED_SIZE": "maybe"}, "MIXED_SIZE='maybe' is neither true nor false"),
    ({"ACCELOPS_VGPU_SYSFS_ROOT": "/nonexistent/sys"}, "sysfs root /nonexistent/sys is not a directory"),
])
def test_bad_settings_are_one_line_naming_the_variable(env, message, tmp_path):
    environ = dict(REQUIRED, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path))
    environ.update(env)
    with pytest.raises(settings.SettingsError, match="^%s" % message.replace("(", r"\(")):
        settings.resolve(parse([]), environ)


def test_the_metrics_endpoint_is_off_unless_a_port_is_set(tmp_path):
    got = settings.resolve(parse([]), dict(REQUIRED, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path)))
    assert (got.metrics_port, got.metrics_bind_address) == (None, "0.0.0.0")
    got = settings.resolve(parse(["--metrics-port", "9465"]),
                           dict(REQUIRED, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path), METRICS_BIND_ADDRESS="::"))
    assert (got.metrics_port, got.metrics_bind_address) == (9465, "::")


@pytest.mark.parametrize("port", ["-1", "65536", "http", "9465.5"])
def test_a_bad_metrics_port_is_one_line_naming_it(tmp_path, port):
    with pytest.raises(settings.SettingsError, match="METRICS_PORT=%r is not a TCP port" % port):
        settings.resolve(parse([]), dict(REQUIRED, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path), METRICS_PORT=port))


def test_an_explicit_sysfs_root_below_the_host_mount_keeps_the_hosts_lock_key(tmp_path):
    """ACCELOPS_VGPU_SYSFS_ROOT=/host/sys names the same lock as the derived root: the boot unit's and the modules'."""
    (tmp_path / "sys").mkdir()
    environ = dict(REQUIRED, HOST_ROOT_MOUNT=str(tmp_path))
    derived = settings.resolve(parse([]), environ)
    given = settings.resolve(parse([]), dict(environ, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path / "sys")))
    flag = settings.resolve(parse(["--sysfs-root", str(tmp_path / "sys") + "/"]), environ)
    assert derived.lock_key == given.lock_key == flag.lock_key == "/sys"
    assert node_lock.lock_name(given.lock_key) == node_lock.lock_name("/sys")
    (tmp_path / ".hidden" / "sys").mkdir(parents=True)
    assert settings.resolve(parse([]), dict(environ, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path / ".hidden" / "sys"))
                            ).lock_key == "/.hidden/sys"


# issue 31.5: the device plugin and the DRA driver on the same GPUs offered every vGPU twice
BOTH = {"DEVICE_PLUGIN": "true", "DRA_DRIVER": "true"}
Gpu = type("Gpu", (), {})


def gpu(address, vendor="10de", device="26b9"):
    found = Gpu()
    found.address, found.vendor, found.device = address, vendor, device
    return found


@pytest.mark.parametrize("env, message", [
    (BOTH, settings.BOTH_MODES),
    (dict(BOTH, DEVICE_PLUGIN_GPUS="0000:41:00.0"), settings.BOTH_MODES),
    (dict(BOTH, DRA_DRIVER_GPUS="10de:26b9"), settings.BOTH_MODES),
    (dict(BOTH, DEVICE_PLUGIN_GPUS="41:00.0,10de:25b6", DRA_DRIVER_GPUS="0000:41:00.0"),
     "DEVICE_PLUGIN_GPUS and DRA_DRIVER_GPUS both name 0000:41:00.0: each GPU is served by one of them only"),
    (dict(BOTH, DEVICE_PLUGIN_GPUS="0x26B910DE", DRA_DRIVER_GPUS="10DE:26B9"),
     "DEVICE_PLUGIN_GPUS and DRA_DRIVER_GPUS both name 10de:26b9"),
    ({"DRA_DRIVER_GPUS": "L40S"}, "DRA_DRIVER_GPUS: 'L40S' is neither a GPU's PCI address"),
])
def test_both_kubelet_modes_need_disjoint_gpus_one_line(env, message, tmp_path):
    with pytest.raises(settings.SettingsError) as refused:
        settings.resolve(parse([]), dict(REQUIRED, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path), **env))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_each_gpu_goes_to_the_mode_that_names_it_and_the_node_is_checked(tmp_path):
    got = settings.resolve(parse(["--device-plugin-gpus", "10de:26b9"]), dict(
        REQUIRED, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path), DRA_DRIVER_GPUS="0000:c1:00.0, 0x25B610DE", **BOTH))
    node = [gpu("0000:41:00.0"), gpu("0000:81:00.0", device="25b6"), gpu("0000:c1:00.0", device="1eb8")]
    settings.check_split(got, node)
    plugin, dra = settings.served(got.device_plugin_gpus, node), settings.served(got.dra_driver_gpus, node)
    assert [g.address for g in node if plugin(g.address)] == ["0000:41:00.0"]
    assert [g.address for g in node if dra(g.address)] == ["0000:81:00.0", "0000:c1:00.0"]
    # an address in one list, its PCI ID in the other: only the node can tell; the agent refuses to start
    both = r"^GPU 0000:c1:00.0 \(10de:26b9\) is in both DEVICE_PLUGIN_GPUS and DRA_DRIVER_GPUS"
    with pytest.raises(settings.SettingsError, match=both):
        settings.check_split(got, [gpu("0000:c1:00.0")])
    alone = settings.resolve(parse([]), dict(REQUIRED, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path), DEVICE_PLUGIN="true"))
    assert settings.served(alone.device_plugin_gpus, node) is None   # one mode alone: every GPU
    settings.check_split(alone, node)


def test_a_claim_time_gpu_is_the_dra_drivers_whatever_dra_driver_gpus_says(tmp_path):
    node = [gpu("0000:41:00.0"), gpu("0000:c1:00.0", device="1eb8")]
    env = dict(REQUIRED, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path), **BOTH)
    split = settings.resolve(parse([]), dict(env, DEVICE_PLUGIN_GPUS="0000:c1:00.0", DRA_DRIVER_GPUS="10de:ffff"))
    settings.check_claim_time(split, node, {"0000:41:00.0"})     # in neither list: the DRA driver's
    by_id = settings.resolve(parse([]), dict(env, DEVICE_PLUGIN_GPUS="10de:26b9", DRA_DRIVER_GPUS="0000:c1:00.0"))
    with pytest.raises(settings.SettingsError) as refused:
        settings.check_claim_time(by_id, node, {"0000:41:00.0"})
    assert str(refused.value) == ("GPU 0000:41:00.0 is claim-time in /etc/vgpu/config.yaml and in DEVICE_PLUGIN_GPUS: "
                                  "a claim-time GPU is served by the DRA driver only; take it out of "
                                  "DEVICE_PLUGIN_GPUS")
    plugin_only = settings.resolve(parse([]), dict(REQUIRED, ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path),
                                                   DEVICE_PLUGIN="true"))
    settings.check_claim_time(plugin_only, node, set())
    with pytest.raises(settings.SettingsError, match=r"^GPU 0000:41:00.0 is claim-time in /etc/vgpu/config.yaml but "
                                                     r"DRA_DRIVER is not true"):
        settings.check_claim_time(plugin_only, node, {"0000:41:00.0"})
