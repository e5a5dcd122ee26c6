import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.accelops.vgpu.plugins.filter.vdm_document import vdm_document

LAYOUTS = {"l40s": [{"device_filter": "0x26B910DE", "profiles": {"L40S-24Q": 2}},
                    {"devices": [0], "profiles": {"L40S-8Q": 6}}]}
DOCUMENT = {"version": "v1", "vgpu-configs": {"l40s": [
    {"devices": "all", "vgpu-devices": {"L40S-24Q": 2}, "device-filter": "0x26B910DE"},
    {"devices": [0], "vgpu-devices": {"L40S-8Q": 6}}]}}


def test_ansible_style_layouts_become_the_vdm_document():
    assert vdm_document(LAYOUTS) == DOCUMENT


def test_a_vdm_document_is_taken_as_is_and_a_file_wins_over_both():
    other = {"version": "v1", "vgpu-configs": {"x": [{"devices": "all", "vgpu-devices": {"T4-8Q": 2}}]}}
    assert vdm_document(LAYOUTS, other) == other
    text = "version: v1\nvgpu-configs:\n  y:\n    - devices: all\n      vgpu-devices: {A16-4Q: 4}\n"
    assert vdm_document(LAYOUTS, other, text) == {"version": "v1", "vgpu-configs": {
        "y": [{"devices": "all", "vgpu-devices": {"A16-4Q": 4}}]}}


@pytest.mark.parametrize("configs, text, message", [
    ({"l40s": {"devices": "all"}}, "", "layout 'l40s' is not a list"),
    ({"l40s": ["L40S-24Q"]}, "", "layout 'l40s' has an entry that is not a mapping"),
    ({}, "version: [v1\n", "the config file is not YAML or JSON"),
])
def test_malformed_input_is_one_line(configs, text, message):
    with pytest.raises(AnsibleFilterError, match=message) as err:
        vdm_document(configs, {}, text)
    assert "\n" not in str(err.value)


SOURCES = ["vgpu_profiles_configs", "vgpu_profiles_vdm_config", "vgpu_profiles_vdm_config_file"]


@pytest.mark.parametrize("configs, vdm_config, text, message", [
    ({}, {}, "", "set exactly one of vgpu_profiles_configs, vgpu_profiles_vdm_config, vgpu_profiles_vdm_config_file "
                 "(set: none)"),
    (LAYOUTS, DOCUMENT, "", "(set: vgpu_profiles_configs, vgpu_profiles_vdm_config)"),
])
def test_sources_must_name_exactly_one(configs, vdm_config, text, message):
    with pytest.raises(AnsibleFilterError) as err:
        vdm_document(configs, vdm_config, text, sources=SOURCES)
    assert message in str(err.value)


@pytest.mark.parametrize("selected", ["missing", ""])
def test_selected_must_be_a_label(selected):
    with pytest.raises(AnsibleFilterError) as err:
        vdm_document(LAYOUTS, sources=SOURCES, selected=selected)
    assert str(err.value) == "selected %r is not one of the labels ['l40s']" % selected
    assert vdm_document(LAYOUTS, sources=SOURCES, selected="l40s") == DOCUMENT
