# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node CLI `accelops-vgpu` as one zipapp, built from this collection's own sources (stdlib only).

Two builders, one layout: tools/build-node-cli.py on the controller (sources read from the
checkout: the agent image, the tests) and the modules, from the sources Ansible shipped with them
(`loaded_source`): `vgpu_profile` on the node, so installing the boot persistence transfers no file
and needs no controller-side build, and the image modules on the build host. The bytes are
reproducible: the same sources give the same archive (fixed timestamps, sorted names, stored
uncompressed so no zlib version can change them).

Two flavours of one entry point, `node_cli.py`:
- the node CLI (`agent=False`): `node_cli.py` and the node engine it imports: `apply`, `assert`,
  `export`, `idle`: what the boot unit and the vGPU manager image run. Its `agent` fails in one line:
  the agent runs from its image.
- the agent CLI (`agent=True`): that, the node agent and the kubelet plugins it loads by setting
  (`AGENT`): the node agent image's.
The archive holds the entry point and the module_utils it needs (followed transitively through the
top-level `from ansible_collections.accelops.vgpu.plugins.module_utils... import` lines), under their
`ansible_collections/accelops/vgpu/plugins/module_utils/` paths with empty `__init__.py` files, and
a `__main__.py` calling `cli.main()`. Ansible itself is not needed on the node.

Ansible's module packer ships the module_utils a module imports, following every import statement
it can see (ansible-core lib/ansible/executor/module_common.py, recursive_finder), also in blocks
that never run, and parses each one on every playbook run. So each module ships the sources of the
flavour it builds and no more: the `TYPE_CHECKING` import below ships the node CLI's closure with
every module that imports this file, and only image/agent_image.py names the agent's (`AGENT`).
node_cli.py imports the agent by name, out of the packer's sight.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import os
import re
import sys
import typing
import zipfile
import zipimport

if typing.TYPE_CHECKING:   # ships the node CLI's sources with the module (see above); never imported at run time
    from ansible_collections.accelops.vgpu.plugins.module_utils import node_cli  # noqa: F401  pylint: disable=unused-import

PACKAGE = "ansible_collections.accelops.vgpu.plugins.module_utils"
ENTRY = "node_cli"
# The agent CLI's further roots: the node agent (node_cli.py imports it by name) and the kubelet plugins it
# imports only when a setting asks for them (the device plugin and the DRA driver: grpcio/protobuf, which the
# agent image has and nodes need not).
AGENT = ("agent.agent", "kubelet.vgpu_device_plugin", "kubelet.dra.agent_plugin")
IMPORT = re.compile(r"^from ansible_collections\.accelops\.vgpu\.plugins\.module_utils((?:\.\w+)*) import "
                    r"(\([^)]*\)|[\w, ]+)", re.MULTILINE)
MAIN = """import sys

from ansible_collections.accelops.vgpu.plugins.module_utils.node_cli import main

sys.exit(main(sys.argv[1:]))
"""
SHEBANG = b"#!/usr/bin/env python3\n"
DATE_TIME = (1980, 1, 1, 0, 0, 0)


def closure(read_source, exists, agent=False):
    """Sorted dotted names below module_utils (e.g. `node.hw.sysfs`) the node CLI needs (`agent`: the agent CLI),
    the roots included.

    `read_source(name)` returns a module's text; `exists(name)` says whether `name` is a module (not a
    package): `from ...module_utils.node.hw import sysfs, pci` imports modules, `from ...node.hw.sysfs import
    Sysfs` a name from one.
    """
    todo, seen = [ENTRY] + list(AGENT if agent else ()), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for package, names in IMPORT.findall(read_source(name)):
            package = package.lstrip(".")
            if package and exists(package):
                todo.append(package)
            else:
                todo.extend(".".join(filter(None, [package, n.split()[0]]))
                            for n in names.strip("()").split(",") if n.strip())
    return sorted(seen)


def archive_files(read_source, exists, agent=False):
    """{archive path: text} of the zipapp: `__main__.py`, the closure and every package's `__init__.py`."""
    root = PACKAGE.replace(".", "/")
    files = {"__main__.py": MAIN}
    for depth in range(1, len(PACKAGE.split(".")) + 1):
        files["/".join(PACKAGE.split(".")[:depth]) + "/__init__.py"] = ""
    for name in closure(read_source, exists, agent):
        parts = name.split(".")
        for depth in range(1, len(parts)):
            files["%s/%s/__init__.py" % (root, "/".join(parts[:depth]))] = ""
        files["%s/%s.py" % (root, "/".join(parts))] = read_source(name)
    return files


def build(read_source, exists, agent=False):
    """The zipapp's bytes (shebang + zip); the same sources always give the same bytes."""
    buffer = io.BytesIO()
    buffer.write(SHEBANG)
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for arcname, text in sorted(archive_files(read_source, exists, agent).items()):
            info = zipfile.ZipInfo(arcname, date_time=DATE_TIME)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            archive.writestr(info, text.encode("utf-8"))
    return buffer.getvalue()


def from_directory(module_utils):
    """(read_source, exists) for the sources in a checkout's `plugins/module_utils` directory."""
    def path(name):
        return os.path.join(module_utils, *name.split(".")) + ".py"

    def read_source(name):
        with open(path(name), encoding="utf-8") as handle:
            return handle.read()

    return read_source, lambda name: os.path.isfile(path(name))


def _spec(name):
    return importlib.util.find_spec("%s.%s" % (PACKAGE, name))


def loaded_exists(name):
    """Whether `name` is a module (not a package) of the running collection."""
    try:
        spec = _spec(name)
    except ImportError:
        return False
    return spec is not None and spec.submodule_search_locations is None


def loaded_source(name):
    """The source of module `name` of the running collection, wherever it was loaded from (a
    checkout, an installed collection, the zip Ansible ships a module in)."""
    spec = _spec(name)
    source = spec.loader.get_source(spec.name) if spec is not None and spec.loader is not None else None
    if source is None:
        raise ImportError("no source for %s.%s" % (PACKAGE, name))
    # Ansible's controller-side collection loader returns bytes, importlib's loaders text
    return source.decode("utf-8") if isinstance(source, bytes) else source


def from_zip(archive, prefix):
    """(read_source, exists) for the sources below `prefix` (`.../module_utils/`) in the zip `archive` (the
    AnsiballZ payload), read as members: zipimport compiles a module to answer `find_spec`, so the
    import system would compile the CLI's whole closure only to find its files."""
    members = zipfile.ZipFile(archive)
    names = set(members.namelist())

    def member(name):
        return prefix + name.replace(".", "/") + ".py"

    def read_source(name):
        if member(name) not in names:   # a module the packer did not ship: that module's imports lack it
            raise ImportError("no source for %s.%s in %s" % (PACKAGE, name, archive))
        return members.read(member(name)).decode("utf-8")

    return read_source, (lambda name: member(name) in names)


def _shipped_zip():
    """(archive, prefix) when module_utils was imported from a zip (zipimport), else None."""
    package = sys.modules.get(PACKAGE)
    loader = getattr(getattr(package, "__spec__", None), "loader", None)
    paths = list(getattr(package, "__path__", None) or [])
    if not isinstance(loader, zipimport.zipimporter) or len(paths) != 1:
        return None
    archive = loader.archive
    if not paths[0].startswith(archive + os.sep):
        return None
    return archive, paths[0][len(archive) + 1:].replace(os.sep, "/") + "/"


def shipped(agent=False):
    """The node CLI (`agent`: the agent CLI) built from the running collection's sources (read, not imported):
    from the zip Ansible shipped the module in, else through the import system (a checkout, an installed
    collection). Each module's source and kind is looked up once: the closure and the archive ask for the
    same names."""
    in_zip = _shipped_zip()
    read_source, exists = from_zip(*in_zip) if in_zip else (loaded_source, loaded_exists)
    return build(functools.lru_cache(maxsize=None)(read_source), functools.lru_cache(maxsize=None)(exists), agent)


def sha1(data):
    return hashlib.sha1(data).hexdigest()
