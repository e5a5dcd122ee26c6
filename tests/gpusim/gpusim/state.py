"""The simulated node's state and the kernel/driver semantics of every write.

Independent of FUSE: tree.py exposes this state as files, fs.py serves them. Every store method
raises SimError(errno) exactly where the kernel (or the NVIDIA driver, as far as known) fails, and
changes nothing in that case. `lock` guards all state; `Device.lock` is the kernel's device_lock,
held across a slow sriov_numvfs store so one PF's latency never blocks another PF.

Releasing a device a VM holds blocks, as in the kernel: removing a VF (sriov_numvfs=0) or unbinding
a device whose VFIO device (or a VF's, an mdev's) a VM has open waits in vfio_unregister_group_dev()
(drivers/vfio/vfio_main.c: "Device is currently in use, task ... blocked until device is released")
until the VM lets go. The kernel waits for ever; gpusim waits `block_timeout` seconds (ctl
block-timeout S) and then fails the write with ETIMEDOUT, so a code path that would hang on a host
hangs in the tests for that long and then shows up as an error naming the holder.
"""

from __future__ import annotations

import errno
import itertools
import re
import threading
import time

from gpusim import layout, placement
from gpusim.devices import UUID_RE, NVIDIA, Device, GpuInstance, Mdev, SimError, kstrtobool, kstrtoul
from gpusim.models import DEFAULT_DRIVER_VERSION, DRIVERS, MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, MODELS, VENDOR_VFIO

BLOCK_TIMEOUT_S = 3.0   # how long a store blocked on a held device waits before gpusim gives up
KEPT_OVER_RESET = ("lock", "closed", "block_timeout")   # reset keeps these (the Condition is bound to the lock)


RECENT, SETTLE = 1.0, 0.2   # seconds: see State._settled_count


class State:
    def __init__(self, spec, latency_ms=0, driver_version=DEFAULT_DRIVER_VERSION):
        self.lock = threading.RLock()
        self.closed = threading.Condition(self.lock)   # notified when a VFIO node is closed
        self.last_open = {}                             # obj uid -> monotonic time of its latest open
        self.block_timeout = BLOCK_TIMEOUT_S
        self.spec = spec
        self.initial = (latency_ms, driver_version)
        self.latency_ms = latency_ms
        self.version = 0
        self.nvidia_loaded = True
        self.nvidia_version = driver_version
        self.dynamic_ids = {name: set() for name in DRIVERS}
        self.open_counts = {}
        self.fail_next = {}
        self.log = []
        self.reads = {}          # canonical path -> opens for reading (`.gpusim/reads`; cleared with the log)
        self.seq = 0
        self.pfs = []
        self.devices = {}
        self.mdevs = {}
        for pf_index, key, dummy in layout.pf_slots(spec):
            pf = Device(layout.pf_address(pf_index), MODELS[key], pf_index, layout.pf_group(pf_index))
            self.pfs.append(pf)
            self.devices[pf.address] = pf
        for pf in self.pfs:
            self._probe(pf)

    # ---- helpers --------------------------------------------------------------------------
    def _changed(self):
        self.version += 1

    def driver_available(self, name):
        return name in DRIVERS and (name != NVIDIA or self.nvidia_loaded)

    def _matches(self, name, dev):
        """Kernel pci_bus_match: driver_override wins; else static IDs or new_id dynamic IDs."""
        if dev.driver_override:
            return dev.driver_override == name
        model = dev.model
        pci_id = (model.vendor, model.vf_device if dev.is_vf else model.device)
        return name == dev.default_driver or pci_id in self.dynamic_ids.get(name, ())

    def _probe(self, dev):
        """Bind the first available matching driver (default driver first), as the PCI core does."""
        if dev.driver:
            return
        for name in [dev.default_driver] + sorted(DRIVERS):
            if name and self.driver_available(name) and self._matches(name, dev):
                self._attach(dev, name)
                return

    def _attach(self, dev, name):
        dev.driver = name
        self._changed()

    def _detach(self, dev):
        """Driver remove: drops vGPUs/mdevs; a PF driver that frees VFs on remove drops them too."""
        if dev.driver is None:
            return
        if not dev.is_vf and dev.vfs and DRIVERS[dev.driver].disables_sriov_on_remove:
            self._disable_vfs(dev)
        for mdev in list(dev.mdevs):
            self._remove_mdev(mdev)
        dev.vgpu_type = 0
        dev.params = {}
        dev.gi = None
        if dev.driver == NVIDIA and not dev.is_vf:
            dev.gis = {}      # GIs are driver state: sriov-manage's unbind wipes them (cubecos, brief §11)
        dev.driver = None
        self._changed()

    def _busy_below(self, dev):
        """Some VM holds the device, one of its VFs, or one of their mdevs."""
        nodes = [dev] + list(dev.vfs)
        return any(self.held(node) or any(self.held(mdev) for mdev in node.mdevs) for node in nodes)

    def _enable_vfs(self, pf, count):
        model = pf.model
        for index in range(count):
            address = layout.vf_address(pf.address, model.vf_offset, model.vf_stride, index)
            vf = Device(address, model, pf.pf_index, layout.vf_group(pf.pf_index, index), pf=pf, vf_index=index)
            pf.vfs.append(vf)
            self.devices[address] = vf
        pf.mixed = False      # sriov-manage -e resets heterogeneous mode (cubecos PR #1338)
        if pf.autoprobe:
            for vf in pf.vfs:
                self._probe(vf)
        self._changed()

    def _disable_vfs(self, pf):
        for vf in pf.vfs:
            self._detach(vf)
            vf.alive = False
            self.devices.pop(vf.address, None)
        pf.vfs = []
        self._changed()

    def _remove_mdev(self, mdev):
        mdev.alive = False
        mdev.parent.mdevs.remove(mdev)
        self.mdevs.pop(mdev.uuid, None)
        self._changed()

    @staticmethod
    def _alive(obj):
        if not obj.alive:
            raise SimError(errno.ENODEV, "device is gone")

    # ---- holds (open VFIO device nodes) ---------------------------------------------------
    def open_handle(self, obj, exclusive=False):
        """A VFIO node opened; `exclusive` (a group node) refuses with EBUSY while any node of it is open."""
        with self.lock:
            if exclusive and self._settled_count(obj):
                raise SimError(errno.EBUSY, "VFIO group of %s is already open" % getattr(obj, "address", obj.uid))
            self.open_counts[obj.uid] = self.open_counts.get(obj.uid, 0) + 1
            self.last_open[obj.uid] = time.monotonic()

    def close_handle(self, obj):
        with self.lock:
            left = self.open_counts.get(obj.uid, 0) - 1
            if left > 0:
                self.open_counts[obj.uid] = left
            else:
                self.open_counts.pop(obj.uid, None)
            self.closed.notify_all()

    def _settled_count(self, obj):
        """Open handles of `obj` once a close in flight has arrived. A close(2) of a VFIO fd releases
        the device before it returns (the kernel runs the release on the way back to user space),
        while FUSE sends RELEASE asynchronously: a node closed just before a write (the engine's
        EBUSY probe) could still count. So a node opened less than RECENT s ago gets up to SETTLE s
        for its close to arrive; a holder open longer than that answers at once."""
        deadline = time.monotonic() + SETTLE
        with self.lock:   # callers may or may not hold it (an RLock): the wait needs it held
            while self.open_counts.get(obj.uid, 0) and time.monotonic() - self.last_open.get(obj.uid, 0) < RECENT:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.closed.wait(left)
            return self.open_counts.get(obj.uid, 0)

    def _wait_released(self, dev, what):
        """Block (the state lock released meanwhile, the device lock kept) until no VM holds `dev`,
        a VF of it or their mdevs, as vfio_unregister_group_dev() does; after block_timeout seconds
        fail with ETIMEDOUT (simulator only: the kernel would still be waiting). Call with self.lock."""
        deadline = time.monotonic() + self.block_timeout
        while self._busy_below(dev):
            left = deadline - time.monotonic()
            if left <= 0:
                holders = sorted(getattr(node, "address", None) or node.uuid
                                 for node in [dev] + list(dev.vfs) + [m for n in [dev] + list(dev.vfs) for m in n.mdevs]
                                 if self.held(node))
                raise SimError(errno.ETIMEDOUT, "%s of %s blocked %.1f s: held by a VM (%s); the kernel blocks until "
                               "the device is released (drivers/vfio/vfio_main.c), gpusim gave up"
                               % (what, dev.address, self.block_timeout, ", ".join(holders)))
            self.closed.wait(left)
        self._alive(dev)

    def held(self, obj):
        return self._settled_count(obj) > 0

    # ---- vGPU placement ---------------------------------------------------------------------
    def running(self, gpu):
        """VgpuTypes running on a physical GPU (a PF and its VFs, their mdevs)."""
        result = []
        for node in [gpu] + list(gpu.vfs):
            if node.vgpu_type:
                result.append(gpu.model.type_by_id(node.vgpu_type))
            result.extend(mdev.vgpu_type for mdev in node.mdevs)
        return result

    def creatable(self, vf):
        """Types this vendor-VFIO VF could take now; a VF that has a vGPU lists none (ASSUMPTION).
        In MIG mode only MIG-backed types with a free GPU instance of their profile (brief §11)."""
        with self.lock:
            if not vf.alive or not vf.vendor_vfio or vf.vgpu_type:
                return []
            if vf.gpu.mig:
                return [t for t in vf.model.mig_types if self._free_gi(vf.gpu, t.gi_profile)]
            running = self.running(vf.gpu)
            return [t for t in vf.model.types if placement.fits(vf.model, running, t, vf.gpu.mixed)]

    def available_instances(self, parent, vgpu_type):
        with self.lock:
            if not parent.alive or not parent.mdev_parent:
                return 0
            running = self.running(parent.gpu)
            if parent.is_vf:        # Ampere: one mdev per VF (HPD A2 fixture: 0 or 1)
                return int(not parent.mdevs and placement.fits(parent.model, running, vgpu_type, parent.gpu.mixed))
            return placement.headroom(parent.model, running, vgpu_type, parent.gpu.mixed)

    # ---- stores: SR-IOV (kernel drivers/pci/iov.c) -------------------------------------------
    def store_numvfs(self, pf, text):
        """sriov_numvfs_store(): EINVAL, ERANGE, same value ok, ENOENT without sriov_configure,
        0 disables, EBUSY while enabled; enabling sleeps `latency_ms` outside the state lock."""
        count = kstrtoul(text, limit=0xffff)
        if count > pf.model.total_vfs:
            raise SimError(errno.ERANGE, "%d > sriov_totalvfs %d" % (count, pf.model.total_vfs))
        with pf.lock:
            with self.lock:
                self._alive(pf)
                if count == len(pf.vfs):
                    return
                driver = DRIVERS.get(pf.driver) if pf.driver else None
                if driver is None:
                    raise SimError(errno.ENOENT, "no driver bound to device; cannot configure SR-IOV")
                if not driver.sriov_configure:
                    raise SimError(errno.ENOENT, "driver does not support SR-IOV configuration via sysfs")
                if count == 0:
                    self._wait_released(pf, "disabling the VFs")
                    self._disable_vfs(pf)
                    return
                if pf.vfs:
                    raise SimError(errno.EBUSY, "%d VFs already enabled. Disable before enabling %d VFs"
                                   % (len(pf.vfs), count))
                delay = self.latency_ms / 1000.0
            if delay:
                time.sleep(delay)
            with self.lock:
                self._alive(pf)
                if pf.driver is None:
                    raise SimError(errno.ENOENT, "driver went away while enabling")
                self._enable_vfs(pf, count)

    def store_autoprobe(self, pf, text):
        value = kstrtobool(text)
        with self.lock:
            self._alive(pf)
            pf.autoprobe = value

    # ---- stores: vendor-specific VFIO (brief §1) ----------------------------------------------
    def store_vgpu_type(self, vf, text):
        """current_vgpu_type: EBUSY while held; 0 clears; same ID no-op; not creatable -> EINVAL."""
        type_id = kstrtoul(text, base=10)
        with self.lock:
            self._alive(vf)
            if not vf.vendor_vfio:
                raise SimError(errno.ENODEV, "VF not bound to nvidia")
            if self.held(vf):
                raise SimError(errno.EBUSY, "VF is held by a VM (ASSUMPTION: errno unconfirmed)")
            if type_id == vf.vgpu_type:
                return
            if type_id == 0:
                vf.vgpu_type = 0
                vf.params = {}
                vf.gi = None      # the GPU instance stays (ASSUMPTION, brief §11: UNCONFIRMED)
                return
            vgpu_type = vf.model.type_by_id(type_id)
            if vgpu_type is not None and vgpu_type.gi_profile is not None and not vf.vgpu_type:
                gi = self._free_gi(vf.gpu, vgpu_type.gi_profile) if vf.gpu.mig else None
                if gi is None:   # cubecos: "Failed to add vgpu create request: 0x38" -> EIO
                    raise SimError(errno.EIO, "no free GPU instance for %s on %s" % (vgpu_type.name, vf.gpu.address))
                vf.vgpu_type, vf.gi = type_id, gi
                vf.params = {"placement_id": str(gi.start), "gpu_instance_id": str(gi.gi_id)}
                return
            if vgpu_type is None or vgpu_type not in self.creatable(vf):
                raise SimError(errno.EINVAL, "type %d is not creatable on %s" % (type_id, vf.address))
            vf.vgpu_type = type_id
            vf.params = {"placement_id": "0", "gpu_instance_id": "0"}

    def store_vf_param(self, vf, name, text):
        with self.lock:
            self._alive(vf)
            if not vf.vendor_vfio:
                raise SimError(errno.ENODEV, "VF not bound to nvidia")
            if self.held(vf):
                raise SimError(errno.EBUSY, "VF is held by a VM")
            value = text.rstrip("\n")
            if name in ("gpu_instance_id", "placement_id"):
                # driver outputs: ENXIO until a vGPU exists (cubecos, Blackwell; brief §11); rewriting the
                # value they show is accepted, any other value refused (ASSUMPTION)
                if not vf.vgpu_type:
                    raise SimError(errno.ENXIO, "%s is set by the driver when a vGPU is created" % name)
                if value != vf.params.get(name):
                    raise SimError(errno.EINVAL, "%s of %s is %s" % (name, vf.address, vf.params.get(name)))
                return
            vf.params[name] = value

    def vf_param(self, vf, name):
        """Empty until a type is set, then placement_id/gpu_instance_id 0 (cubecos#312, ASSUMPTION
        for time-sliced types); warm_update reads 0 (cubecos#312)."""
        with self.lock:
            return vf.params.get(name, "0" if name == "warm_update" else "")

    # ---- stores: mdev (kernel drivers/vfio/mdev) ---------------------------------------------
    def store_mdev_create(self, parent, vgpu_type, text):
        value = text.rstrip("\n")
        if not UUID_RE.match(value):
            raise SimError(errno.EINVAL, "not a UUID: %r" % value[:40])
        uuid = value.lower()
        with self.lock:
            self._alive(parent)
            if uuid in self.mdevs:
                raise SimError(errno.EEXIST, "mdev %s already exists (kernel mdev_device_create)" % uuid)
            if not self.available_instances(parent, vgpu_type):
                raise SimError(errno.EINVAL, "no instance of %s available (ASSUMPTION: errno)" % vgpu_type.name)
            used = {mdev.group for mdev in self.mdevs.values()}
            group = next(g for g in itertools.count(layout.MDEV_FIRST_GROUP) if g not in used)
            mdev = Mdev(uuid, parent, vgpu_type, group)
            parent.mdevs.append(mdev)
            self.mdevs[uuid] = mdev
            self._changed()

    def store_mdev_remove(self, mdev, text):
        value = kstrtoul(text)
        with self.lock:
            self._alive(mdev)
            if not value:
                return
            if self.held(mdev):
                raise SimError(errno.EBUSY, "mdev %s is held by a VM" % mdev.uuid)
            self._remove_mdev(mdev)

    # ---- stores: driver binding (kernel drivers/pci/pci-driver.c, drivers/base/bus.c) ---------
    def _device_from(self, text):
        address = text.strip()
        dev = self.devices.get(address)
        if dev is None:
            raise SimError(errno.ENODEV, "no device %r" % address[:40])
        return dev

    def store_bind(self, driver, text):
        with self.lock:
            dev = self._device_from(text)
            if dev.driver:
                raise SimError(errno.EBUSY, "%s is bound to %s" % (dev.address, dev.driver))
            if not self._matches(driver, dev):
                raise SimError(errno.ENODEV, "%s does not match %s" % (driver, dev.address))
            if driver == "vfio-pci" and dev.is_vf and dev.model.framework == VENDOR_VFIO:
                raise SimError(errno.EINVAL, "vendor-VFIO VF refuses vfio-pci (kubevirt#17642)")
            self._attach(dev, driver)

    def store_unbind(self, driver, text):
        with self.lock:
            dev = self._device_from(text)
            if dev.driver != driver:
                raise SimError(errno.ENODEV, "%s is not bound to %s" % (dev.address, driver))
            self._wait_released(dev, "unbinding from " + driver)
            if dev.driver != driver:
                raise SimError(errno.ENODEV, "%s is not bound to %s" % (dev.address, driver))
            self._detach(dev)

    def store_new_id(self, driver, text):
        parts = text.split()
        if len(parts) < 2 or not all(re.match(r"^[0-9a-fA-F]{1,4}$", p) for p in parts[:2]):
            raise SimError(errno.EINVAL, "new_id wants 'vendor device' in hex")
        with self.lock:
            self.dynamic_ids[driver].add((parts[0].lower().zfill(4), parts[1].lower().zfill(4)))
            for dev in list(self.devices.values()):
                if not dev.driver and self._matches(driver, dev):
                    self._attach(dev, driver)

    def store_override(self, dev, text):
        with self.lock:
            self._alive(dev)
            dev.driver_override = text.strip()

    # ---- control (ROOT/.gpusim/ctl) --------------------------------------------------------------
    def set_mixed(self, address, enable):
        with self.lock:
            pf = self.devices.get(address)
            if pf is None or pf.is_vf or not pf.model.is_gpu or not self.nvidia_loaded:
                raise SimError(errno.ENODEV, "no NVIDIA GPU %s" % address)
            if not pf.model.mixed_size:
                raise SimError(errno.EOPNOTSUPP, "%s does not support mixed-size mode" % pf.model.product)
            if enable != pf.mixed and self.running(pf):
                raise SimError(errno.EBUSY, "vGPUs exist on %s" % address)
            pf.mixed = enable

    # ---- MIG (nvidia-smi -mig, nvidia-smi mig; brief §11) ------------------------------------------
    def _mig_gpu(self, address):
        pf = self.devices.get(address)
        if pf is None or pf.is_vf or not pf.model.is_gpu or pf.driver != NVIDIA or not self.nvidia_loaded:
            raise SimError(errno.ENODEV, "no NVIDIA GPU %s bound to nvidia" % address)
        if not pf.model.mig:
            raise SimError(errno.EOPNOTSUPP, "%s does not support MIG" % pf.model.product)
        return pf

    def _free_gi(self, gpu, profile_id):
        used = {id(vf.gi) for vf in gpu.vfs if vf.gi is not None}
        free = [gi for gi in gpu.gis.values() if gi.profile.profile_id == profile_id and id(gi) not in used]
        return min(free, key=lambda gi: gi.gi_id) if free else None

    def _gi_user(self, gpu, gi):
        return next((vf for vf in gpu.vfs if vf.gi is gi), None)

    def set_mig(self, address, enable):
        """-mig 1 refused while a VM holds a VF or vGPUs exist (ASSUMPTION); -mig 0 refused while VFs exist
        (cubecos, Blackwell) or GPU instances exist (ASSUMPTION). No GPU reset needed (Hopper, UNCONFIRMED)."""
        with self.lock:
            pf = self._mig_gpu(address)
            if enable == pf.mig:
                return
            if self._busy_below(pf):
                raise SimError(errno.EBUSY, "a VF of %s is held by a VM" % address)
            if enable and self.running(pf):
                raise SimError(errno.EBUSY, "vGPUs exist on %s" % address)
            if not enable and (pf.vfs or pf.gis):
                raise SimError(errno.EBUSY, "%s still has %s" % (address, "VFs" if pf.vfs else "GPU instances"))
            pf.mig = enable
            self._changed()

    def create_gi(self, address, profile_id, compute_instance, start=None):
        """Free placement of the profile with the highest start (ASSUMPTION: the driver's choice is not
        documented; highest-first keeps combinations like 3g+2g+2g possible); ENOSPC when none. `start`: at
        that placement only (NVML nvmlDeviceCreateGpuInstanceWithPlacement; `-cgi <ID>:<start>`): EINVAL when
        the profile has no such placement, ENOSPC when it overlaps a GI."""
        with self.lock:
            pf = self._mig_gpu(address)
            if not pf.mig:
                raise SimError(errno.EINVAL, "MIG mode is not enabled on %s" % address)
            profile = pf.model.gi_profile(profile_id)
            if profile is None:
                raise SimError(errno.ENOENT, "no GPU instance profile %s on %s" % (profile_id, address))
            existing = list(pf.gis.values())
            taken = set().union(*[gi.slices for gi in existing]) if existing else set()
            compute = sum(gi.profile.compute_slices for gi in existing)
            same = sum(1 for gi in existing if gi.profile.profile_id == profile_id)
            starts = [start for start in profile.starts
                      if not taken & set(range(start, start + profile.size)) and start + profile.size <= MIG_MEMORY_SLICES]
            if start is not None:
                if start not in profile.starts:
                    raise SimError(errno.EINVAL, "%s has no placement starting at %d" % (profile.name, start))
                starts = [s for s in starts if s == start]
            if same >= profile.max_instances or not starts or compute + profile.compute_slices > MIG_COMPUTE_SLICES:
                raise SimError(errno.ENOSPC, "no room for %s on %s" % (profile.name, address))
            gi_id = next(i for i in itertools.count(1) if i not in pf.gis)
            pf.gis[gi_id] = GpuInstance(gi_id, profile, starts[-1], bool(compute_instance))
            self._changed()
            return gi_id

    def _gi(self, address, gi_id):
        pf = self._mig_gpu(address)
        gi = pf.gis.get(gi_id)
        if gi is None:
            raise SimError(errno.ENOENT, "no GPU instance %s on %s" % (gi_id, address))
        if self._gi_user(pf, gi) is not None:
            raise SimError(errno.EBUSY, "GPU instance %d is used by the vGPU of %s" % (gi_id, self._gi_user(pf, gi).address))
        return pf, gi

    def destroy_ci(self, address, gi_id):
        with self.lock:
            dummy, gi = self._gi(address, gi_id)
            if not gi.compute_instance:
                raise SimError(errno.ENOENT, "GPU instance %d has no compute instance" % gi_id)
            gi.compute_instance = False

    def create_ci(self, address, gi_id):
        with self.lock:
            dummy, gi = self._gi(address, gi_id)
            if gi.compute_instance:
                raise SimError(errno.ENOSPC, "GPU instance %d already has its compute instance" % gi_id)
            gi.compute_instance = True

    def destroy_gi(self, address, gi_id):
        with self.lock:
            pf, gi = self._gi(address, gi_id)
            if gi.compute_instance:
                raise SimError(errno.EBUSY, "GPU instance %d still has a compute instance" % gi_id)
            del pf.gis[gi_id]
            self._changed()

    def reboot(self):
        """Host reboot / vGPU manager restart: VFs, types, mdevs, modes and bindings reset."""
        with self.lock:
            for pf in self.pfs:
                self._disable_vfs(pf)
                for mdev in list(pf.mdevs):
                    self._remove_mdev(mdev)
                pf.driver = None
                pf.driver_override = ""
                pf.autoprobe = True
                pf.mixed = False
                pf.mig = False    # Hopper: MIG mode is lost on reboot / GPU reset (brief §11)
                pf.gis = {}
            self.dynamic_ids = {name: set() for name in DRIVERS}
            for pf in self.pfs:
                self._probe(pf)
            self._changed()

    def restart_manager(self):
        """The vGPU manager restarts (its pod, brief §6: stop = `sriov-manage -d ALL` and the modules
        unloaded; start = modules loaded, `sriov-manage -e ALL`). Net effect: the driver stays and every
        GPU stays bound to nvidia; SR-IOV GPUs have all their VFs again (new ones), none with a vGPU type;
        mdevs, GPU instances and mixed-size mode are gone; MIG mode stays (no GPU reset: ASSUMPTION).
        EBUSY while a VM holds a device (the modules would not unload)."""
        with self.lock:
            if not self.nvidia_loaded:
                raise SimError(errno.ENODEV, "the nvidia module is not loaded")
            gpus = [pf for pf in self.pfs if pf.model.is_gpu and pf.driver == NVIDIA]
            if any(self._busy_below(pf) for pf in gpus):
                raise SimError(errno.EBUSY, "Module nvidia is in use")
            for pf in gpus:
                for mdev in list(pf.mdevs):
                    self._remove_mdev(mdev)
                self._disable_vfs(pf)
                pf.gis = {}
                pf.mixed = False
                if pf.model.sriov:
                    self._enable_vfs(pf, pf.model.total_vfs)
            self._changed()

    def reset(self):
        """Back to the state right after `gpusim up` (log, injected failures, driver version too);
        lets a test harness reuse one mount for many tests."""
        fresh = State(self.spec, latency_ms=self.initial[0], driver_version=self.initial[1])
        with self.lock:
            version = self.version
            for old in list(self.devices.values()) + list(self.mdevs.values()):
                old.alive = False       # a store still sleeping on an old PF must not revive it
            for name, item in vars(fresh).items():
                if name not in KEPT_OVER_RESET:
                    setattr(self, name, item)
            self.version = version + 1

    def unload_nvidia(self):
        with self.lock:
            if not self.nvidia_loaded:
                return
            bound = [dev for dev in self.devices.values() if dev.driver == NVIDIA]
            if any(self._busy_below(dev) for dev in bound):
                # no block here: a VM's open VFIO device holds a reference on the module, and rmmod /
                # modprobe -r refuse a module in use at once ("Module nvidia is in use", kmod's
                # refcount check; delete_module(2) itself would answer EWOULDBLOCK)
                raise SimError(errno.EBUSY, "Module nvidia is in use")
            for dev in sorted(bound, key=lambda d: d.is_vf):
                self._detach(dev)
            for pf in self.pfs:
                if pf.model.is_gpu:
                    pf.mixed = False
            self.nvidia_loaded = False
            self.dynamic_ids[NVIDIA] = set()
            self._changed()

    def load_nvidia(self, version=None):
        with self.lock:
            self.nvidia_version = version or self.nvidia_version or DEFAULT_DRIVER_VERSION
            if self.nvidia_loaded:
                return
            self.nvidia_loaded = True
            for dev in sorted(self.devices.values(), key=lambda d: d.is_vf):
                if not dev.is_vf or dev.pf.autoprobe:
                    self._probe(dev)
            self._changed()

    # ---- log and injected failures -------------------------------------------------------------
    def record(self, path, value, error=None):
        with self.lock:
            self.seq += 1
            entry = {"seq": self.seq, "path": path, "value": value}
            if error is None:
                entry["result"] = "ok"
            else:
                entry["result"] = "error"
                entry["errno"] = errno.errorcode.get(error, str(error))
            self.log.append(entry)

    def read_counts(self):
        with self.lock:
            return dict(self.reads)

    def count_read(self, path):
        with self.lock:
            self.reads[path] = self.reads.get(path, 0) + 1

    def take_failure(self, path):
        with self.lock:
            return self.fail_next.pop(path, None)

    def find(self, name):
        """A PCI device by address or an mdev by UUID (for hold/release)."""
        with self.lock:
            return self.devices.get(name) or self.mdevs.get(name.lower())

    def snapshot(self):
        """What .gpusim/state.json shows: read by the fake nvidia-smi and the test helpers."""
        with self.lock:
            gpus = [{"address": pf.address, "model": pf.model.key, "product": pf.model.product,
                     "pci_id": pf.model.pci_id, "framework": pf.model.framework, "mixed_size": pf.mixed,
                     "mixed_size_supported": pf.model.mixed_size, "driver": pf.driver, "sriov": pf.model.sriov,
                     "numvfs": len(pf.vfs), "framebuffer_gib": pf.model.framebuffer_gib,
                     "types": [{"id": t.type_id, "name": t.name, "framebuffer_gib": t.framebuffer_gib,
                                "max_instances": t.max_instances, "gi_profile": t.gi_profile}
                               for t in pf.model.all_types],
                     "mig_supported": pf.model.mig, "mig_mode": pf.mig,
                     "gi_profiles": [{"id": p.profile_id, "name": p.name, "size": p.size, "starts": list(p.starts),
                                      "max_instances": p.max_instances, "memory_gib": p.memory_gib,
                                      "compute_slices": p.compute_slices, "engines": list(p.engines)}
                                     for p in pf.model.gi_profiles],
                     "gis": [{"id": gi.gi_id, "profile": gi.profile.profile_id, "name": gi.profile.name,
                              "start": gi.start, "size": gi.profile.size, "compute_instance": gi.compute_instance,
                              "vf": getattr(self._gi_user(pf, gi), "address", None)}
                             for gi in sorted(pf.gis.values(), key=lambda gi: gi.gi_id)]}
                    for pf in self.pfs]
            held = {}
            for dev in list(self.devices.values()) + list(self.mdevs.values()):
                if self.held(dev):
                    held[getattr(dev, "address", None) or dev.uuid] = self.open_counts[dev.uid]
            return {"spec": self.spec, "latency_ms": self.latency_ms,
                    "nvidia": {"loaded": self.nvidia_loaded, "version": self.nvidia_version},
                    "pfs": gpus, "held": held}
