import argparse

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import settings
from ansible_collections.accelops.vgpu.plugins.module_utils.node import node_lock


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
