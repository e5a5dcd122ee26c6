"""Simulated PCI functions and mdevs, the kernel's errno exception and its number parsers."""

from __future__ import annotations

import errno
import itertools
import os
import re
import threading

from gpusim import layout
from gpusim.models import MDEV_ON_PF, MDEV_ON_VF, VENDOR_VFIO

NVIDIA = "nvidia"
_uids = itertools.count(1)
_U16 = re.compile(r"^\+?(0x[0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)$")
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class SimError(OSError):
    """A write refused with a kernel errno; `detail` is what dmesg would say."""

    def __init__(self, code, detail=""):
        super().__init__(code, os.strerror(code) + (" (%s)" % detail if detail else ""))


def kstrtoul(text, base=0, limit=0xffffffffffffffff):
    """Kernel kstrto*(): optional '+', base 0 prefixes, one trailing newline; else EINVAL."""
    value = text[:-1] if text.endswith("\n") else text
    if base == 10:
        match = re.match(r"^\+?[0-9]+$", value)
    else:
        match = _U16.match(value)
    if not match:
        raise SimError(errno.EINVAL, "not a number: %r" % text[:32])
    digits = value.lstrip("+")
    number = int(digits, 16) if digits.lower().startswith("0x") else (
        int(digits, 8) if base != 10 and len(digits) > 1 and digits.startswith("0") else int(digits))
    if number > limit:
        raise SimError(errno.EINVAL, "out of range: %r" % text[:32])
    return number


def kstrtobool(text):
    """Kernel kstrtobool(): y/Y/1/n/N/0, on/off."""
    low = text.lower()
    if low[:1] in ("y", "1"):
        return True
    if low[:1] in ("n", "0"):
        return False
    if low.startswith("on"):
        return True
    if low.startswith("of"):
        return False
    raise SimError(errno.EINVAL, "not a boolean: %r" % text[:32])


class Device:
    """A PCI function (PF or VF)."""

    def __init__(self, address, model, pf_index, group, pf=None, vf_index=None):
        self.uid = next(_uids)
        self.address = address
        self.model = model
        self.pf_index = pf_index
        self.group = group
        self.pf = pf
        self.vf_index = vf_index
        self.driver = None
        self.driver_override = ""
        self.alive = True
        self.lock = threading.Lock()
        self.vfs = []            # PF: its VFs
        self.autoprobe = True    # PF: sriov_drivers_autoprobe
        self.mixed = False       # PF: vGPU heterogeneous (mixed-size) mode of this GPU
        self.mig = False         # PF: MIG mode (runtime state on Hopper: a reboot resets it)
        self.gis = {}            # PF: GPU instance ID -> GpuInstance
        self.gi = None           # vendor-VFIO VF: the GpuInstance its MIG-backed vGPU occupies
        self.vgpu_type = 0       # vendor-VFIO VF: current_vgpu_type
        self.params = {}         # vendor-VFIO VF: vgpu_params, gpu_instance_id, placement_id, warm_update
        self.mdevs = []          # mdev parent: its mdevs

    @property
    def is_vf(self):
        return self.pf is not None

    @property
    def gpu(self):
        """The physical GPU (its PF)."""
        return self.pf or self

    @property
    def default_driver(self):
        return self.model.vf_driver if self.is_vf else self.model.driver

    @property
    def vendor_vfio(self):
        """A VF typed through nvidia/ (vendor-specific VFIO framework) right now."""
        return self.is_vf and self.model.framework == VENDOR_VFIO and self.driver == NVIDIA

    @property
    def mdev_parent(self):
        if self.driver != NVIDIA:
            return False
        return (self.model.framework == MDEV_ON_VF and self.is_vf) or (
            self.model.framework == MDEV_ON_PF and not self.is_vf)

    @property
    def vfio(self):
        """vfio<N> cdev number when the device has vfio-dev/ (vendor-VFIO VF, or any function bound to
        vfio-pci: a VF, or a PF passed through whole)."""
        if self.vendor_vfio or self.driver == "vfio-pci":
            return layout.vfio_number(self.group)
        return None


class GpuInstance:
    """A MIG GPU instance: profile, placement (memory slice start) and whether it has a compute instance."""

    def __init__(self, gi_id, profile, start, compute_instance):
        self.gi_id = gi_id
        self.profile = profile
        self.start = start
        self.compute_instance = compute_instance

    @property
    def slices(self):
        return set(range(self.start, self.start + self.profile.size))


class Mdev:
    def __init__(self, uuid, parent, vgpu_type, group):
        self.uid = next(_uids)
        self.uuid = uuid
        self.parent = parent
        self.vgpu_type = vgpu_type
        self.group = group
        self.alive = True

    @property
    def vfio(self):
        return layout.vfio_number(self.group)
