"""Which vGPU types one physical GPU can still take, given those it already runs.

Homogeneous (default) mode: after the first vGPU, only types of the same framebuffer size, any
series (24Q next to 24A), up to framebuffer / size instances (NVML nvmlDeviceGetCreatableVgpus doc;
cubecos#1316; counts VDM config-example, brief §1.4, §9). Mixed-size mode (nvidia-smi vgpu -shm 1):
any size while the sum of framebuffers fits (brief §1.4); per-type maxima still apply.
"""

from __future__ import annotations


def fits(model, running, candidate, mixed):
    """May `candidate` (a VgpuType) be added to a GPU of `model` that runs `running` (VgpuTypes)?"""
    same_type = sum(1 for vgpu in running if vgpu.type_id == candidate.type_id)
    if same_type >= candidate.max_instances:
        return False
    if mixed:
        used = sum(vgpu.framebuffer_gib for vgpu in running)
        return used + candidate.framebuffer_gib <= model.framebuffer_gib
    if not running:
        return candidate.max_instances >= 1
    if any(vgpu.framebuffer_gib != candidate.framebuffer_gib for vgpu in running):
        return False
    return len(running) < candidate.max_instances


def headroom(model, running, candidate, mixed):
    """How many more `candidate` instances fit (mdev `available_instances` on a PF parent)."""
    count = 0
    trial = list(running)
    while fits(model, trial, candidate, mixed):
        trial.append(candidate)
        count += 1
    return count
