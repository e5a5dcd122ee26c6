# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the kubelet's plugin sockets live, from one setting: the kubelet's root directory.

The kubelet's `--root-dir` is /var/lib/kubelet by default; k0s (/var/lib/k0s/kubelet), MicroK8s
(/var/snap/microk8s/common/var/lib/kubelet) and others move it, so every path below derives from it
[kubernetes/kubelet pkg/apis/deviceplugin/v1beta1/constants.go:30-32 DevicePluginPath, KubeletSocket;
the kubelet's plugin watcher serves plugins_registry/]. Standard library only.
"""

from __future__ import annotations

import os

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.errors import SocketPathError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.claim_holders import DEFAULT_KUBELET_DIR

KUBELET_DIR_ENV = "KUBELET_DIR"
# sockaddr_un.sun_path is 108 bytes with the trailing NUL (unix(7))
MAX_SOCKET_PATH = 107


def check_socket_path(path):
    """`path`, or SocketPathError naming it when it is longer than a unix socket path may be."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SocketPathError("socket %s: %d bytes, a unix socket path has at most %d (use a shorter kubelet "
                              "directory)" % (path, len(os.fsencode(path)), MAX_SOCKET_PATH))
    return path


class KubeletPaths:
    """The socket paths under one kubelet root directory."""

    def __init__(self, root=DEFAULT_KUBELET_DIR):
        self.root = root

    @property
    def device_plugins(self):
        """The device plugin directory: kubelet.sock and one socket per plugin."""
        return os.path.join(self.root, "device-plugins")

    @property
    def kubelet_socket(self):
        """The kubelet's v1beta1.Registration service."""
        return os.path.join(self.device_plugins, "kubelet.sock")

    def device_plugin_socket(self, endpoint):
        """A device plugin's socket; `endpoint` is the file name it registers with."""
        return check_socket_path(os.path.join(self.device_plugins, endpoint))

    @property
    def plugins_registry(self):
        """The plugin watcher's directory (pluginregistration.Registration sockets: DRA, CSI)."""
        return os.path.join(self.root, "plugins_registry")

    def registration_socket(self, name):
        """`<root>/plugins_registry/<name>-reg.sock`, the name drivers use by convention."""
        return check_socket_path(os.path.join(self.plugins_registry, "%s-reg.sock" % name))

    def plugin_dir(self, name):
        """`<root>/plugins/<name>`, where a DRA driver serves its service socket."""
        return os.path.join(self.root, "plugins", name)
