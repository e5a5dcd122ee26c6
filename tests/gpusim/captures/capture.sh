#!/usr/bin/env bash
# Read-only capture of one NVIDIA PF: nothing here writes to sysfs, resets or changes settings.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
exec 2>>"$O/errors.txt"
uname -a > "$O/uname.txt"; cat /proc/cmdline >> "$O/uname.txt"
command -v lspci >/dev/null && lspci -nn -D > "$O/lspci-nn.txt"
PFS=$(for d in /sys/bus/pci/devices/*; do [ "$(cat $d/vendor)" = 0x10de ] && case $(cat $d/class) in 0x03*) echo ${d##*/};; esac; done)
echo "$PFS" > "$O/pfs.txt"
for pf in $PFS; do
  D=/sys/bus/pci/devices/$pf
  command -v lspci >/dev/null && lspci -vvv -nn -s "$pf" > "$O/lspci-vvv-$pf.txt"
  {
    for f in vendor device class subsystem_vendor subsystem_device revision numa_node local_cpulist \
             sriov_totalvfs sriov_numvfs sriov_offset sriov_stride sriov_vf_device sriov_drivers_autoprobe \
             sriov_vf_total_msix enable current_link_speed current_link_width max_link_speed max_link_width \
             driver_override reset_method d3cold_allowed power_state irq; do
      [ -e "$D/$f" ] && printf '%s\t%s\n' "$f" "$(tr '\n' ' ' < "$D/$f" 2>&1 | sed 's/ $//')"
    done
    for l in driver iommu_group physfn; do [ -L "$D/$l" ] && printf '%s ->\t%s\n' "$l" "$(readlink "$D/$l")"; done
  } > "$O/sysfs-pf-$pf.txt"
  ls -la "$D" > "$O/sysfs-pf-ls-$pf.txt"
  [ -d "$D/nvidia" ] && ls -la "$D/nvidia" > "$O/sysfs-pf-nvidia-ls-$pf.txt"
  g=$(basename "$(readlink "$D/iommu_group")" 2>/dev/null); echo "$g" > "$O/iommu-group-$pf.txt"
  [ -n "$g" ] && ls -la /sys/kernel/iommu_groups/$g/devices >> "$O/iommu-group-$pf.txt"
done
ls -la /sys/class/vfio /dev/vfio > "$O/vfio.txt" 2>&1
lsmod > "$O/lsmod.txt" 2>&1
nvidia-smi > "$O/nvidia-smi.txt" 2>&1
nvidia-smi -q > "$O/nvidia-smi-q.txt" 2>&1
nvidia-smi mig -lgip > "$O/nvidia-smi-mig-lgip.txt" 2>&1; echo "rc=$?" >> "$O/nvidia-smi-mig-lgip.txt"
nvidia-smi vgpu -s > "$O/nvidia-smi-vgpu-s.txt" 2>&1; echo "rc=$?" >> "$O/nvidia-smi-vgpu-s.txt"
cat /proc/driver/nvidia/version > "$O/driver-version.txt" 2>&1
grep -E ' (proc|sysfs) ' /proc/self/mountinfo > "$O/mountinfo-proc-sysfs.txt"
# how a real kernel shows a thread with its own fd table: /proc/PID/fd vs /proc/PID/task/TID/fd
python3 - > "$O/thread-fd-table.txt" 2>&1 <<'PY'
import ctypes, os, threading, time
libc = ctypes.CDLL(None, use_errno=True)
ready, done = threading.Event(), threading.Event()
info = {}
def worker():
    assert libc.unshare(0x400) == 0, ctypes.get_errno()   # CLONE_FILES
    fd = os.open("/dev/zero", os.O_RDONLY)
    info["tid"], info["fd"] = threading.get_native_id(), fd
    ready.set(); done.wait()
t = threading.Thread(target=worker); t.start(); ready.wait()
pid = os.getpid()
def rdevs(d):
    out = []
    for n in os.listdir(d):
        try:
            st = os.stat(os.path.join(d, n))
            if st.st_rdev: out.append((n, os.major(st.st_rdev), os.minor(st.st_rdev)))
        except OSError as e: out.append((n, "err", e.errno))
    return sorted(out, key=str)
zero = os.stat("/dev/zero").st_rdev
print("dev_zero", os.major(zero), os.minor(zero))
print("thread fd", info["fd"], "tid", info["tid"])
print("/proc/PID/fd has /dev/zero:", any(r[1:] == (1, 5) for r in rdevs("/proc/%d/fd" % pid)))
print("/proc/PID/task/TID/fd has /dev/zero:", any(r[1:] == (1, 5) for r in rdevs("/proc/%d/task/%d/fd" % (pid, info["tid"]))))
print("/proc/TID/fd (hidden tid dir) has /dev/zero:", any(r[1:] == (1, 5) for r in rdevs("/proc/%d/fd" % info["tid"])))
done.set(); t.join()
PY
echo done > "$O/done.txt"
