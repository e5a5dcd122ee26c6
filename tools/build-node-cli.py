# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the node CLI `accelops-vgpu` as one zipapp file (stdlib only, any python3 >= 3.7).

The output is reproducible: the same sources give the same bytes (fixed zip timestamps). Next to
OUT goes OUT.sha1, the SHA-1 of OUT, so a role need not read the archive to know its checksum.

    python3 tools/build-node-cli.py [OUT]        # default OUT: .build/accelops-vgpu.pyz
    python3 OUT apply --config vgpu.yaml --selected default

The archive holds `node/cli.py` and the module_utils it imports (followed transitively), under their
`ansible_collections/accelops/vgpu/plugins/module_utils/` paths with empty `__init__.py` files, and a
`__main__.py` calling `cli.main()`. Ansible itself is not needed on the node.
"""

import hashlib
import os
import re
import sys
import zipfile

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "ansible_collections/accelops/vgpu/plugins/module_utils"
SOURCE = os.path.join(TOP, "plugins", "module_utils")
IMPORT = re.compile(r"^from ansible_collections\.accelops\.vgpu\.plugins\.module_utils((?:\.\w+)*) import "
                    r"(\([^)]*\)|[\w, ]+)", re.MULTILINE)
MAIN = """import sys

from ansible_collections.accelops.vgpu.plugins.module_utils.node.cli import main

sys.exit(main(sys.argv[1:]))
"""


def closure(start):
    """Dotted module paths below module_utils (e.g. `node.sysfs`) that `start` needs, itself included."""
    todo, seen = [start], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        with open(os.path.join(SOURCE, *name.split(".")) + ".py") as handle:
            text = handle.read()
        for package, names in IMPORT.findall(text):
            package = package.lstrip(".")
            candidates = [n.split()[0] for n in names.strip("()").split(",") if n.strip()]
            if package and os.path.isfile(os.path.join(SOURCE, *package.split(".")) + ".py"):
                todo.append(package)  # `from ...module_utils.node.sysfs import Sysfs`
            else:  # `from ...module_utils[.node] import a, b`: a and b are modules
                todo.extend(".".join(filter(None, [package, n])) for n in candidates)
    return sorted(seen)


def build(out):
    """Write the zipapp; fixed timestamps and order make the same sources give the same bytes."""
    files = {"__main__.py": MAIN}
    for depth in range(1, len(PACKAGE.split("/")) + 1):
        files["/".join(PACKAGE.split("/")[:depth]) + "/__init__.py"] = ""
    for name in closure("node.cli"):
        parts = name.split(".")
        for depth in range(1, len(parts)):
            files["%s/%s/__init__.py" % (PACKAGE, "/".join(parts[:depth]))] = ""
        with open(os.path.join(SOURCE, *parts) + ".py") as handle:
            files["%s/%s.py" % (PACKAGE, "/".join(parts))] = handle.read()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "wb") as handle:
        handle.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as archive:
            for arcname in sorted(files):
                info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, files[arcname])
    os.chmod(tmp, 0o755)
    with open(tmp, "rb") as handle:
        checksum = hashlib.sha1(handle.read()).hexdigest()
    # OUT.sha1 first: whoever sees OUT may rely on its checksum file (the vgpu_profiles role does)
    with open(out + ".sha1.tmp", "w") as handle:
        handle.write(checksum + "\n")
    os.replace(out + ".sha1.tmp", out + ".sha1")
    os.replace(tmp, out)
    return out


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else os.path.join(TOP, ".build", "accelops-vgpu.pyz")
    print(build(target))
