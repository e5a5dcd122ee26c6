"""Deterministic addresses: SPEC -> PFs with bus numbers, VF addresses, IOMMU groups, vfio<N>.

Numbering (documented in the README so tests can predict it):
- PFs are numbered p = 0, 1, 2 ... in SPEC order (an A16 board counts as 4 PFs, one per GPU);
  PF p sits at 0000:<0x41 + p>:00.0 in the directory devices/pci0000:<bus>/.
- VF i of a PF: routing ID = PF devfn + sriov_offset + i * sriov_stride (kernel pci_iov_virtfn_bus/devfn),
  so L40S VFs are <bus>:00.4, 00.5, 00.6, 00.7, 01.0 ... 04.3.
- IOMMU groups: PF p -> group p; VF i of PF p -> group 100 * (p + 1) + i; mdevs get the lowest free
  group from 5000 up, in creation order.
- vfio cdev: vfio<N> with N = iommu group - 100 (VF i of PF p -> vfio<100 * p + i>; mdevs 4900 + ...);
  a PF bound to vfio-pci (whole-GPU passthrough) -> vfio<9900 + p>.
"""

from __future__ import annotations

import re

from gpusim.models import MAX_VFS_PER_PF, MODELS

FIRST_BUS = 0x41
MDEV_FIRST_GROUP = 5000
VFIO_OFFSET = 100
PF_VFIO_FIRST = 9900    # cdevs of PFs bound to vfio-pci (their groups are < VFIO_OFFSET)


class SpecError(ValueError):
    """A SPEC the catalogue cannot satisfy; the message names the offending part."""


def parse_spec(spec):
    """'l40s:2,t4:1' -> [('l40s', 2), ('t4', 1)]; a bare model name counts 1."""
    result = []
    for part in [p.strip() for p in str(spec).split(",") if p.strip()]:
        name, dummy, count = part.partition(":")
        name = name.strip().lower()
        if name not in MODELS:
            raise SpecError("unknown model %r in SPEC (known: %s)" % (name, ", ".join(MODELS)))
        if count and not re.match(r"^\d+$", count.strip()):
            raise SpecError("count %r for %s is not a number" % (count, name))
        number = int(count) if count else 1
        if number < 1:
            raise SpecError("count for %s must be at least 1" % name)
        result.append((name, number))
    if not result:
        raise SpecError("empty SPEC (example: l40s:2,t4:1)")
    return result


def pf_slots(spec):
    """[(pf_index, model_key, board_gpu_index)] in SPEC order."""
    slots = []
    for name, count in parse_spec(spec):
        for dummy in range(count):
            for gpu in range(MODELS[name].gpus_per_board):
                slots.append((len(slots), name, gpu))
    if FIRST_BUS + len(slots) > 0xff:
        raise SpecError("too many PFs (%d): at most %d" % (len(slots), 0xff - FIRST_BUS))
    return slots


def pf_address(pf_index):
    return "0000:%02x:00.0" % (FIRST_BUS + pf_index)


def split_address(address):
    domain, bus, rest = address.split(":")
    dev, fn = rest.split(".")
    return int(domain, 16), int(bus, 16), (int(dev, 16) << 3) | int(fn, 16)


def vf_address(pf_addr, offset, stride, vf_index):
    """Kernel drivers/pci/iov.c pci_iov_virtfn_bus()/devfn(): routing ID arithmetic."""
    domain, bus, devfn = split_address(pf_addr)
    rid = (bus << 8) + devfn + offset + stride * vf_index
    return "%04x:%02x:%02x.%d" % (domain, rid >> 8, (rid & 0xff) >> 3, rid & 7)


def pf_group(pf_index):
    return pf_index


def vf_group(pf_index, vf_index):
    assert vf_index < MAX_VFS_PER_PF
    return 100 * (pf_index + 1) + vf_index


def vfio_number(group):
    return group - VFIO_OFFSET if group >= VFIO_OFFSET else PF_VFIO_FIRST + group


def numa_node(pf_index, pf_count):
    """The NUMA node of a GPU (and its VFs, which report their PF's): GPUs split across two sockets as on
    dual-socket servers, the first half on node 0, the rest on node 1 (one GPU: node 0)."""
    return 0 if pf_count < 2 else pf_index * 2 // pf_count


def root_dir(pf_addr):
    """devices/pci0000:<bus> holding the PF and its VFs."""
    domain, bus, dummy = split_address(pf_addr)
    return "devices/pci%04x:%02x" % (domain, bus)
