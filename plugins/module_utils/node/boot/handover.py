# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who owns a node's layout when both the boot unit (vgpu_profiles) and the node agent are installed.

The agent owns the node once it has applied a config there: after each successful apply it writes
the config it applied, as a one-config vgpu-device-manager document, to `agent-applied.json` next to
the boot unit's layout (`/etc/accelops-vgpu/`). The boot unit and the vGPU manager image run
`accelops-vgpu apply --agent-applied <that file>`: while it exists it wins over --config/--selected,
so a reboot or a manager restart re-applies what the agent last applied, never the inventory's older
choice. Handing the node back to Ansible removes the file (vgpu_profiles with
vgpu_profiles_reclaim_from_agent). docs/design.md "Who owns a node's layout".
"""

from __future__ import annotations

import json
import os

from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import write_file

NODE_DIR = "/etc/accelops-vgpu"
FILE_NAME = "agent-applied.json"
BOOT_LAYOUT = "layout.json"   # vgpu_profiles' layout beside it: the boot unit is installed on this node
OWNER = "accelops-vgpu-agent"


def document(name, config_entries):
    """The one-config document the agent writes (validated by the same parser the CLI reads it with)."""
    doc = {"version": "v1", "vgpu-configs": {name: config_entries}}
    vgpu_layout.from_document(doc, name, "config %s" % name)
    return doc


def write(path, name, config_entries):
    """Atomically write `path` (0644) where the boot unit is installed (its layout.json beside it; the agent's
    pod mounts the directory on every node); returns True when written, False when there is no boot path."""
    directory = os.path.dirname(path)
    if not os.path.isfile(os.path.join(directory, BOOT_LAYOUT)):
        return False
    text = json.dumps(document(name, config_entries), indent=2, sort_keys=True) + "\n"
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return True
    except OSError:
        pass
    write_file(path, text, 0o644)
    return True


def applied_by_agent(path):
    """True when `path` is set and the agent's file exists there (the agent owns the node)."""
    return bool(path) and os.path.isfile(path)
