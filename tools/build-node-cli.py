# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the node CLI `accelops-vgpu` as one zipapp file (stdlib only, any python3 >= 3.7).

    python3 tools/build-node-cli.py [--without-agent] [OUT]    # default OUT: .build/accelops-vgpu.pyz
    python3 OUT apply --config vgpu.yaml --selected default

By default the agent CLI (every verb, `agent` included: what the node agent image runs); with
--without-agent the node CLI (the node engine alone: what `vgpu_profile` installs for the boot unit
and the vGPU manager image carries). The layout and the bytes come from
plugins/module_utils/cli_zipapp.py, which the modules also use: the same sources give the same
bytes. Next to OUT goes OUT.sha1, the SHA-1 of OUT, so a role need not read the archive to know
its checksum. Ansible itself is not needed on the node.
"""

import importlib.util
import os
import sys

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(TOP, "plugins", "module_utils")


def _load_builder():
    # by path: the checkout need not be importable as ansible_collections.accelops.vgpu
    spec = importlib.util.spec_from_file_location("accelops_cli_zipapp", os.path.join(SOURCE, "cli_zipapp.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(out, agent=True):
    """Write the zipapp (and OUT.sha1) atomically; returns OUT."""
    builder = _load_builder()
    data = builder.build(*builder.from_directory(SOURCE), agent=agent)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".tmp", "wb") as handle:
        handle.write(data)
    os.chmod(out + ".tmp", 0o755)
    # OUT.sha1 first: whoever sees OUT may rely on its checksum file
    with open(out + ".sha1.tmp", "w") as handle:
        handle.write(builder.sha1(data) + "\n")
    os.replace(out + ".sha1.tmp", out + ".sha1")
    os.replace(out + ".tmp", out)
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    with_agent = "--without-agent" not in args
    args = [a for a in args if a != "--without-agent"]
    if len(args) > 1 or any(a.startswith("-") for a in args):
        sys.exit("usage: build-node-cli.py [--without-agent] [OUT]")
    print(build(args[0] if args else os.path.join(TOP, ".build", "accelops-vgpu.pyz"), with_agent))
