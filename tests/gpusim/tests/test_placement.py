"""The fit rules (placement.py) as properties over random create sequences, without a mount."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusim import placement
from gpusim.models import MODELS

VGPU_MODELS = [m for m in MODELS.values() if m.types]


@settings(max_examples=200, deadline=None)
@given(model=st.sampled_from(VGPU_MODELS), mixed=st.booleans(), picks=st.lists(st.integers(0, 99), max_size=40))
def test_accepted_sequences_respect_framebuffer_and_sizes(model, mixed, picks):
    running = []
    for pick in picks:
        candidate = model.types[pick % len(model.types)]
        if placement.fits(model, running, candidate, mixed):
            running.append(candidate)
    assert sum(t.framebuffer_gib for t in running) <= model.framebuffer_gib
    for vgpu_type in set(running):
        assert running.count(vgpu_type) <= vgpu_type.max_instances
    if not mixed and running:
        assert len({t.framebuffer_gib for t in running}) == 1
        assert len(running) <= running[0].max_instances


@given(model=st.sampled_from(VGPU_MODELS), index=st.integers(0, 99))
def test_headroom_on_an_empty_gpu_is_the_type_maximum(model, index):
    vgpu_type = model.types[index % len(model.types)]
    assert placement.headroom(model, [], vgpu_type, False) == vgpu_type.max_instances


def test_l40s_counts_match_the_vdm_table():
    model = MODELS["l40s"]
    counts = {t.short_name: t.max_instances for t in model.types if t.short_name.endswith("Q")}
    assert counts == {"L40S-48Q": 1, "L40S-24Q": 2, "L40S-16Q": 3, "L40S-12Q": 4, "L40S-8Q": 6, "L40S-6Q": 8,
                      "L40S-4Q": 12, "L40S-3Q": 16, "L40S-2Q": 24, "L40S-1Q": 32}
