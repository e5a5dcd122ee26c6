"""One writer of a vGPU (issue 41.1): only node/engine/vgpu_writer.py writes a VF's `current_vgpu_type` or creates and
removes an mdev; every other file of plugins/ and tools/ may name the attribute only where it reads it (READS,
each site listed with why), and writes no vGPU attribute.

Two scans of the source (AST), so that neither a new write nor a new unlisted read goes unseen:
- every string literal naming `current_vgpu_type` (docstrings and the modules' DOCUMENTATION/RETURN aside) lies in a
  listed read site (file, enclosing function);
- no `.write(...)` / `open(..., "w")` outside the owner has a vGPU attribute in its target (the attribute's name, a
  VF's `vfio_dir(...)`, an mdev's `remove` or `create`, or the owner's `type_path`).
"""

import ast
import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils import errors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(errors.__file__)))
SCANNED = ("plugins", "tools")
OWNER = "plugins/module_utils/node/engine/vgpu_writer.py"
ATTRIBUTE = "current_vgpu_type"
DOC_NAMES = {"DOCUMENTATION", "EXAMPLES", "RETURN"}     # an Ansible module's documentation strings
READS = {
    ("plugins/module_utils/node/hw/vgpu_types.py", "read_current"): "the read helper every reader uses",
    ("plugins/module_utils/node/hw/vgpu_types.py", "has_vfio_types"): "whether the attribute exists",
    ("plugins/module_utils/node/engine/vgpu_apply.py", "<module>"): "NO_VGPU, an error message",
    ("plugins/module_utils/node/engine/sriov.py", "_programmed"): "an error message",
    ("plugins/module_utils/kubelet/device_plugin.py", "CurrentTypes.of"): "Allocate's read (a kept descriptor)",
    ("plugins/module_utils/kubelet/dra/claim_time_prepare.py", "ClaimTimePreparer._vfs"): "whether a VF is still there",
    ("plugins/module_utils/agent/manager_probe.py", "<module>"): "VFIO_TYPE, the sentinel the probe reads",
    ("tools/demo.py", "print_next_steps"): "a `cat` command printed",
    ("tools/demo.py", "vgpus_on"): "counts typed VFs",
    ("tools/demo_claim_time.py", "Scene.prepare"): "prints a read type",
    ("tools/demo_claim_time.py", "Scene.unprepare"): "prints read types",
    ("tools/demo_claim_time.py", "Scene.current"): "reads a VF's type (open for reading)",
}
# what names a vGPU attribute in a write's target
TARGET_STRINGS = (ATTRIBUTE, "/remove", "/create")
TARGET_NAMES = {"vfio_dir", "type_path", "TYPE_ATTRIBUTE"}


def _sources():
    for top in SCANNED:
        for directory, dummy, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                if name.endswith(".py") and not name.endswith(("_pb2.py", "_pb2_grpc.py")):
                    path = os.path.join(directory, name)
                    yield os.path.relpath(path, REPO), path


def _docstrings(tree):
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in DOC_NAMES for t in node.targets):
            found.update(id(n) for n in ast.walk(node.value))
    return found


def _scopes(tree):
    """{id(node): qualified name of the function or class it lies in, or '<module>'}."""
    scope = {}

    def visit(node, name):
        for child in ast.iter_child_nodes(node):
            inner = name
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = child.name if name == "<module>" else "%s.%s" % (name, child.name)
            scope[id(child)] = inner
            visit(child, inner)
    visit(tree, "<module>")
    return scope


def literal_sites(text, rel):
    """[(rel, scope, line)] of string literals naming the attribute, docstrings and module docs aside."""
    tree = ast.parse(text)
    docs, scope = _docstrings(tree), _scopes(tree)
    return [(rel, scope[id(node)], node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and ATTRIBUTE in node.value
            and id(node) not in docs]


def _names_vgpu_attribute(node):
    for part in ast.walk(node):
        if isinstance(part, ast.Constant) and isinstance(part.value, str) and any(
                s in part.value for s in TARGET_STRINGS):
            return True
        if isinstance(part, ast.Name) and part.id in TARGET_NAMES or \
                isinstance(part, ast.Attribute) and part.attr in TARGET_NAMES:
            return True
    return False


def _opens_for_writing(call):
    modes = call.args[1:2] + [k.value for k in call.keywords if k.arg in ("mode", "flags")]
    return any(isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wa+") or
               any(isinstance(n, ast.Attribute) and n.attr in ("O_WRONLY", "O_RDWR") for n in ast.walk(m))
               for m in modes)


def write_sites(text, rel):
    """[(rel, line)] of writes whose target names a vGPU attribute: `x.write(target, ...)`, `open(target, "w")`,
    `os.open(target, os.O_WRONLY)`."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        writes = name == "write" or name == "open" and _opens_for_writing(node)
        if writes and _names_vgpu_attribute(node.args[0]):
            found.append((rel, node.lineno))
    return found


def test_only_the_owner_writes_a_vgpu():
    assert os.path.isfile(os.path.join(REPO, OWNER))
    writes = []
    for rel, path in _sources():
        if rel != OWNER:
            with open(path) as handle:
                writes += write_sites(handle.read(), rel)
    assert writes == []


def test_every_other_mention_of_the_type_attribute_is_a_listed_read():
    unlisted, seen = [], set()
    for rel, path in _sources():
        if rel == OWNER:
            continue
        with open(path) as handle:
            for site in literal_sites(handle.read(), rel):
                seen.add(site[:2])
                if site[:2] not in READS:
                    unlisted.append(site)
    assert unlisted == []
    assert sorted(set(READS) - seen) == []      # a listed site that is gone is taken off the list


@pytest.mark.parametrize("source", [
    'sysfs.write(vgpu_types.vfio_dir(vf) + "/current_vgpu_type", 0)\n',
    'sysfs.write(vt.vfio_dir(vf) + "/" + name, type_id)\n',
    'self.sysfs.write("%s/%s/remove" % (MDEV_DEVICES, uuid), 1)\n',
    'sysfs.write(type_path(vf), 5)\n',
    'with open(os.path.join(root, "nvidia", "current_vgpu_type"), "w") as f:\n    pass\n',
    'fd = os.open(path + "/current_vgpu_type", os.O_WRONLY)\n',
])
def test_the_scan_sees_a_write(source):
    assert write_sites(source, "x.py") == [("x.py", 1)]


def test_the_scan_tells_reads_and_docstrings_apart():
    source = ('"""Writes current_vgpu_type."""\n'
              'def f(sysfs, vf):\n'
              '    """current_vgpu_type: read."""\n'
              '    return sysfs.read(vfio_dir(vf) + "/current_vgpu_type")\n'
              'with open(root + "/current_vgpu_type") as handle:\n    pass\n')
    assert write_sites(source, "x.py") == []
    assert literal_sites(source, "x.py") == [("x.py", "f", 4), ("x.py", "<module>", 5)]
