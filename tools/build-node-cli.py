# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the node CLI `accelops-vgpu` as one zipapp file (stdlib only, any python3 >= 3.7).

    python3 tools/build-node-cli.py [OUT]        # default OUT: .build/accelops-vgpu.pyz
    python3 OUT apply --config vgpu.yaml --selected default

The archive holds `cli.py` and the module_utils it imports (followed transitively), under their
`ansible_collections/accelops/vgpu/plugins/module_utils/` paths with empty `__init__.py` files, and a
`__main__.py` calling `cli.main()`. Ansible itself is not needed on the node.
"""

import os
import re
import shutil
import sys
import tempfile
import zipapp

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "ansible_collections/accelops/vgpu/plugins/module_utils"
SOURCE = os.path.join(TOP, "plugins", "module_utils")
IMPORT = re.compile(r"^from ansible_collections\.accelops\.vgpu\.plugins\.module_utils(?:\.(\w+))? import "
                    r"(\([^)]*\)|[\w, ]+)", re.MULTILINE)
MAIN = """import sys

from ansible_collections.accelops.vgpu.plugins.module_utils.cli import main

sys.exit(main(sys.argv[1:]))
"""


def closure(start):
    """Module names (files in module_utils) that `start` needs, itself included."""
    todo, seen = [start], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        with open(os.path.join(SOURCE, name + ".py")) as handle:
            text = handle.read()
        for module, names in IMPORT.findall(text):
            if module:
                todo.append(module)
            else:  # `from ...module_utils import a, b`
                todo.extend(n.split()[0] for n in names.strip("()").split(",") if n.strip())
    return sorted(seen)


def build(out):
    staging = tempfile.mkdtemp(prefix="accelops-vgpu-pyz-")
    try:
        package = os.path.join(staging, PACKAGE)
        os.makedirs(package)
        part = staging
        for name in PACKAGE.split("/"):
            part = os.path.join(part, name)
            open(os.path.join(part, "__init__.py"), "w").close()
        for name in closure("cli"):
            shutil.copy(os.path.join(SOURCE, name + ".py"), os.path.join(package, name + ".py"))
        with open(os.path.join(staging, "__main__.py"), "w") as handle:
            handle.write(MAIN)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        zipapp.create_archive(staging, out, interpreter="/usr/bin/env python3")
    finally:
        shutil.rmtree(staging)
    return out


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else os.path.join(TOP, ".build", "accelops-vgpu.pyz")
    print(build(target))
