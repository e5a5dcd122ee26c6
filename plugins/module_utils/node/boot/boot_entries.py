# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot persistence files of one apply run, composed from the apply module's options (`boot_files`).

Each `boot_files` item names its path and mode and exactly one source: `content` (as given), `checksum`
(looked at, never written), `layout: true` (the config this run applies, as JSON: what the node CLI reads
at boot), `node_cli: true` (the node CLI zipapp, built on the node from the shipped sources: the module
passes the builder, node/ does not import the packer above it), `unit: {...}` (accelops-vgpu.service,
boot_unit_file.py, from this run's layout and node CLI paths and the module's options), or `remove: true`
(none: a file that must not stay). Paths land below `boot_files_root`; the unit keeps the node-absolute
paths. The result is what boot_files.py validates, installs or removes: nothing here writes.
"""

from __future__ import annotations

import json
import os

from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_files, boot_unit_file

SOURCES = ("content", "layout", "node_cli", "unit", "checksum")


def _files_root(root):
    """boot_files_root, refused in one line (before the apply: bad input writes nothing) unless it is absolute
    and, where it exists, a directory; a relative one would only show up as relative boot file paths."""
    if not os.path.isabs(root):
        raise boot_files.BootFileError("boot_files_root: %r is not an absolute path" % (root,))
    if os.path.lexists(root) and not os.path.isdir(root):
        raise boot_files.BootFileError("boot_files_root: %s is not a directory" % root)
    return root


def _below(root, path):
    """Where a node-absolute path lands below `root` (a relative one is left for boot_files to refuse)."""
    return os.path.join(root, os.path.relpath(path, "/")) if os.path.isabs(path) else path


def _unit_text(item, items, params):
    """The boot unit for this run's layout: the layout and node CLI entries' node paths, the module's options."""
    named = dict((key, [other["path"] for other in items if other[key] and not other["remove"]])
                 for key in ("layout", "node_cli"))
    missing = [key for key in ("layout", "node_cli") if len(named[key]) != 1] + ([] if params["selected"] else ["selected"])
    if missing:
        raise boot_files.BootFileError("boot_files: %s: the unit needs one layout entry, one node_cli entry and the "
                                       "selected option (missing or more than one: %s)" % (item["path"], ", ".join(missing)))
    unit = item["unit"]
    command = boot_unit_file.exec_start(
        named["node_cli"][0], named["layout"][0], params["selected"], unit["agent_applied"],
        (params["sysfs_root"], params["dev_root"], params["proc_root"], params["kubelet_dir"]), params)
    return boot_unit_file.text(params["selected"], named["layout"][0], command, unit["manager_units"],
                               unit["before_units"], unit["retry_for"], unit["state_file"])


def entries(items, params, node_cli, present=True):
    """The boot_files entries for the engine, below `params["boot_files_root"]`: `layout`, `node_cli` (the bytes
    `node_cli()` returns) and `unit` become their content (absent: only the paths matter, nothing is built)."""
    found = []
    root = _files_root(params["boot_files_root"]) if items else None
    for item in items:
        given = [key for key in SOURCES if item[key] not in (None, False)]
        if item["remove"] and given:
            raise boot_files.BootFileError("boot_files: %s is to be removed, it takes none of %s (has %s)"
                                           % (item["path"], ", ".join(SOURCES), ", ".join(given)))
        if len(given) != 1 and not item["remove"]:
            raise boot_files.BootFileError("boot_files: %s needs exactly one of %s (has %s)"
                                           % (item["path"], ", ".join(SOURCES), ", ".join(given) or "none"))
        entry = dict(path=_below(root, item["path"]), mode=item["mode"],
                     own_directory=item["own_directory"], remove=item["remove"])
        found.append(entry)
        if not present or item["remove"]:  # removed whatever they hold
            continue
        if item["layout"]:
            if params["config"] is None:
                raise boot_files.BootFileError("boot_files: %s: layout needs the config option" % item["path"])
            entry["content"] = json.dumps(params["config"], indent=4, sort_keys=True) + "\n"
        elif item["node_cli"]:
            entry["content"] = node_cli()
        elif item["unit"]:
            entry["content"] = _unit_text(item, items, params)
        else:
            entry[given[0]] = item[given[0]]
    return found
