"""The agent's Helm chart with the real helm: lint, its values schema, every rendered object against the Kubernetes
JSON schemas of 1.33-1.37 (kubernetes-validate, strict), deploy/install.yaml and the kustomize base, an OCI push to
a local registry, and install.yaml applied to the API server double."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.tests.fakes.registry import LocalRegistry
from chart_helpers import (CHART, EXAMPLE_VALUES, INSTALL_YAML, KUBECTL, NAME, NAMESPACE, as_applied, by_kind, helm,
                           register_chart_kinds, render, stored_objects)
from cluster_helpers import ROOT, default_state, run_playbook

KUBERNETES_VERSIONS = ("1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0")
EXAMPLE = ("--values", EXAMPLE_VALUES)


def test_helm_lint_passes_with_the_example_values():
    proc = helm("lint", "--strict", CHART, *EXAMPLE)
    assert "0 chart(s) failed" in proc.stdout, proc.stdout


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_is_valid_for_kubernetes(version):
    everything = ("--set", "createNamespace=true", "--set", "mountNvidiaRun=true", "--set", "sriovManage=/x",
                  "--set-json", 'extraEnv={"LOCK_TIMEOUT": 60}', "--set-json", 'image={"pullSecrets": ["pull"]}')
    objects = render(*EXAMPLE, *everything)
    assert sorted(by_kind(objects)) == sorted([
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
        "DaemonSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"])
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)  # raises naming the field


def test_an_invalid_object_fails_the_schema_check():
    """The check above can fail: a DaemonSet field the API does not have is rejected."""
    daemonset = by_kind(render(*EXAMPLE))["DaemonSet"]
    daemonset["spec"]["template"]["spec"]["containers"][0]["privilegd"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, "1.37.0", strict=True)


def test_the_configmap_holds_the_layouts_in_vgpu_device_manager_form():
    config = json.loads(by_kind(render(*EXAMPLE))["ConfigMap"]["data"]["config.json"])
    assert config == {"version": "v1", "vgpu-configs": {
        "l40s-2x24q": [{"devices": "all", "device-filter": "0x26B910DE", "vgpu-devices": {"L40S-24Q": 2}}],
        "l40s-6x8q": [{"devices": "all", "device-filter": "0x26B910DE", "vgpu-devices": {"L40S-8Q": 6}}]}}
    env = {e["name"]: e.get("value") for e in by_kind(render(*EXAMPLE))["DaemonSet"]["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["DEFAULT_VGPU_CONFIG"] == "l40s-2x24q"


@pytest.mark.parametrize("args, message", [
    (("--set-json", 'configs={"a": [{"profiles": {"L40S24Q": 2}}]}', "--set", "defaultConfig=a"),
     "'L40S24Q' does not match pattern"),
    (("--set-json", 'configs={"a": [{"profiles": {"L40S-24Q": 0}}]}', "--set", "defaultConfig=a"),
     "minimum: got 0, want 1"),
    (EXAMPLE + ("--set-json", 'nodeSelector={"gpu nodes": "yes"}'), "'gpu nodes' does not match pattern"),
    (EXAMPLE + ("--set-json", 'nodeSelector={"gpu": "yes please"}'), "'yes please' does not match pattern"),
    (EXAMPLE + ("--set", "resyncInterval=-5"), "minimum: got -5, want 1"),
    (EXAMPLE + ("--set", "metrics.port=-1"), "minimum: got -1, want 1"),
    (EXAMPLE + ("--set", "metrics.port=70000"), "maximum: got 70,000, want 65,535"),
    (EXAMPLE + ("--set", "defaultConfig=l40s-9x9q"),
     'defaultConfig "l40s-9x9q" is not one of the layouts ["l40s-2x24q","l40s-6x8q"]'),
    ((), "configs (or vdmConfig) must have at least one layout"),
    (EXAMPLE + ("--set", "image.pullPolicy=Sometimes"), "value must be one of"),
    (EXAMPLE + ("--set", "imageTag=1"), "additional properties 'imageTag' not allowed"),
    # issue 31.5: the device plugin and the DRA driver on the same GPUs offered every vGPU twice
    (EXAMPLE + ("--set", "devicePlugin.enabled=true", "--set", "dra.enabled=true"),
     "at '/devicePlugin/gpus': minItems: got 0, want 1"),
    (EXAMPLE + ("--set", "devicePlugin.enabled=true", "--set", "dra.enabled=true", "--set", "devicePlugin.gpus={10de:26b9}"),
     "at '/dra/gpus': minItems: got 0, want 1"),
    (EXAMPLE + ("--set", "dra.enabled=true", "--set", "dra.gpus={L40S}"), "'L40S' does not match pattern"),
])
def test_wrong_values_fail_helm_template_with_a_clear_message(args, message):
    proc = helm("template", NAME, CHART, "--namespace", NAMESPACE, *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not proc.stdout.strip()


def test_device_plugin_and_dra_on_disjoint_gpus_render_and_lint():
    split = EXAMPLE + ("--set", "devicePlugin.enabled=true", "--set", "dra.enabled=true",
                       "--set", "devicePlugin.gpus={10de:26b9}", "--set", "dra.gpus={0000:c1:00.0,0x25B610DE}")
    assert helm("lint", "--strict", CHART, *split).returncode == 0
    rendered = yaml.safe_load_all(helm("template", NAME, CHART, "--namespace", NAMESPACE, *split).stdout)
    pod = [o for o in rendered if o and o["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]
    env = dict((e["name"], e.get("value")) for e in pod["containers"][0]["env"])
    assert (env["DEVICE_PLUGIN_GPUS"], env["DRA_DRIVER_GPUS"]) == ("10de:26b9", "0000:c1:00.0,0x25B610DE")


def test_the_probes_and_the_scrape_target_are_the_agents_endpoint():
    pod = by_kind(render(*EXAMPLE, "--set", "metrics.port=9999"))["DaemonSet"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["METRICS_PORT"], env["METRICS_BIND_ADDRESS"]) == ("9999", "0.0.0.0")
    assert container["ports"] == [{"name": "metrics", "containerPort": 9999, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "9999",
                                              "prometheus.io/path": "/metrics"}


def test_the_pod_reads_the_hosts_procfs_without_host_pid_and_the_design_says_so():
    """Issue 32 item 9: the DaemonSet shares no host namespace; the in-use scan reads the host's procfs, mounted
    read-only where the agent's proc root defaults to ($HOST_ROOT_MOUNT/proc), and docs/design.md says that."""
    spec = by_kind(render(*EXAMPLE))["DaemonSet"]["spec"]["template"]["spec"]
    assert not any(spec.get(key) for key in ("hostPID", "hostNetwork", "hostIPC"))
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    root = env.get("HOST_ROOT_MOUNT", "/host")
    assert "ACCELOPS_VGPU_PROC_ROOT" not in env     # the default: the host's procfs under the mount
    volume = next(v["name"] for v in spec["volumes"] if v.get("hostPath", {}).get("path") == "/proc")
    assert {"name": volume, "mountPath": root + "/proc", "readOnly": True} in container["volumeMounts"]
    design = " ".join((ROOT / "docs" / "design.md").read_text().split())
    assert "runs with hostPID" not in design
    assert "the shipped DaemonSet does not run with hostPID" in design


def test_the_profile_name_pattern_is_the_engines():
    """values.schema.json's profile name pattern accepts and rejects what the engine's parser does."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    pattern = re.compile(schema["definitions"]["profileName"]["pattern"])
    for name in ("L40S-24Q", "H100-1-20C", "H200X-3-71C", "A16-2B", "RTXPro6000D-4-24CME", "L40S-48QGFX",
                 "L40S24Q", "L40S-Q", "-24Q", "L40S-24q", "L40S-24QX"):
        assert bool(pattern.match(name)) == bool(vgpu_types._PROFILE.match(name)), name


def test_install_yaml_and_the_gitops_patches_are_the_rendered_chart(tmp_path):
    subprocess.run([str(ROOT / "tools" / "render-manifests.sh"), str(tmp_path / "deploy")], check=True,
                   env={"HELM": str(ROOT / ".venv" / "bin" / "helm"), "PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    rendered = sorted(p.relative_to(tmp_path / "deploy") for p in (tmp_path / "deploy").rglob("*.yaml"))
    assert rendered == [Path("gitops/clusterpolicy-vgpu-device-manager.yaml"), Path("gitops/kubevirt-permitted-host-devices.yaml"),
                        Path("gitops/kustomization-patches.yaml"), Path("install.yaml")]
    for path in rendered:
        assert (tmp_path / "deploy" / path).read_text() == (ROOT / "deploy" / path).read_text(), \
            "deploy/%s is stale: run tools/render-manifests.sh" % path


def test_the_gitops_patches_keep_foreign_kubevirt_entries(tmp_path):
    """The generated patches in a GitOps repo's kustomization: the KubeVirt CR keeps its NIC, gains the L40S
    resource and the HostDevices gate; the ClusterPolicy's vgpuDeviceManager is off, its other fields stay."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "deploy" / "gitops", repo)
    nic = {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/x710"}
    (repo / "cluster.yaml").write_text(yaml.safe_dump_all([
        {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
         "spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": [nic]},
                                    "developerConfiguration": {"featureGates": ["Snapshot"]}}}},
        {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
         "spec": {"sandboxWorkloads": {"enabled": True}, "vgpuDeviceManager": {"enabled": True}}}]))
    kustomization = yaml.safe_load((repo / "kustomization-patches.yaml").read_text())
    kustomization.update({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                          "resources": ["cluster.yaml"]})
    (repo / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    proc = subprocess.run([str(KUBECTL), "kustomize", str(repo)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    out = by_kind(yaml.safe_load_all(proc.stdout))
    configuration = out["KubeVirt"]["spec"]["configuration"]
    assert configuration["permittedHostDevices"]["pciHostDevices"] == [
        nic, {"resourceName": "nvidia.com/NVIDIA_L40S", "pciVendorSelector": "10DE:26B9"}]
    assert configuration["developerConfiguration"]["featureGates"] == ["Snapshot", "HostDevices"]
    assert out["ClusterPolicy"]["spec"] == {"sandboxWorkloads": {"enabled": True}, "vgpuDeviceManager": {"enabled": False}}


def test_a_kustomize_overlay_changes_image_and_layouts(tmp_path):
    """The README's overlay: the base deploy/ with another image and another layout catalogue."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "config.json").write_text(json.dumps({"version": "v1", "vgpu-configs": {
        "l40s-4x12q": [{"devices": "all", "vgpu-devices": {"L40S-12Q": 4}}]}}))
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy", overlay)],
        "images": [{"name": "registry.example.com/accelops/vgpu-node-agent",
                    "newName": "registry.corp/gpu/vgpu-node-agent", "newTag": "2.0"}],
        "configMapGenerator": [{"name": NAME, "namespace": NAMESPACE, "behavior": "replace",
                                "files": ["config.json"], "options": {"disableNameSuffixHash": True}}],
        "patches": [{"target": {"kind": "DaemonSet", "name": NAME}, "patch": yaml.safe_dump([
            {"op": "replace", "path": "/spec/template/spec/containers/0/env/3/value", "value": "l40s-4x12q"}])}]}))
    proc = subprocess.run([str(KUBECTL), "kustomize", str(overlay)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    objects = by_kind(yaml.safe_load_all(proc.stdout))
    container = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.corp/gpu/vgpu-node-agent:2.0"
    assert {"name": "DEFAULT_VGPU_CONFIG", "value": "l40s-4x12q"} in container["env"]
    assert "l40s-4x12q" in objects["ConfigMap"]["data"]["config.json"]
    for obj in objects.values():
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_the_packaged_chart_goes_to_an_oci_registry_and_back(tmp_path):
    with LocalRegistry(tmp_path / "registry") as registry:
        env_home = {"HELM_CONFIG_HOME": str(tmp_path / "helm-config"), "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
                    "HELM_REGISTRY_CONFIG": str(tmp_path / "helm-config" / "registry.json")}

        def run(*args):
            proc = subprocess.run([str(ROOT / ".venv" / "bin" / "helm")] + [str(a) for a in args], capture_output=True,
                                  text=True, env=dict(env_home, PATH="/usr/bin:/bin", HOME=str(tmp_path)),
                                  timeout=120, check=False)
            assert proc.returncode == 0, "helm %s: %s" % (args[0], proc.stderr)
            return proc

        run("package", CHART, "--destination", tmp_path)
        package = tmp_path / "accelops-vgpu-node-agent-0.1.0.tgz"
        assert package.exists()
        run("registry", "login", registry.host, "--username", registry.username, "--password", registry.password,
            "--plain-http")
        run("push", package, "oci://%s/charts" % registry.host, "--plain-http")
        assert registry.tags("charts/accelops-vgpu-node-agent") == ["0.1.0"]
        shown = run("show", "chart", "oci://%s/charts/accelops-vgpu-node-agent" % registry.host, "--version", "0.1.0",
                    "--plain-http")
        assert yaml.safe_load(shown.stdout)["name"] == "accelops-vgpu-node-agent"
        pulled = run("template", NAME, "oci://%s/charts/accelops-vgpu-node-agent" % registry.host, "--version",
                     "0.1.0", "--plain-http", "--namespace", NAMESPACE, "--values", EXAMPLE_VALUES)
        assert [d for d in yaml.safe_load_all(pulled.stdout) if d] == render(*EXAMPLE)


def test_install_yaml_applies_to_the_api_server(api_server, kubeconfig, tmp_path):
    """deploy/install.yaml through kubernetes.core.k8s (what Argo CD and Flux do with kubectl's apply), twice."""
    api_server.reset(register_chart_kinds(default_state()))
    inventory = {"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}}}}
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [{
        "name": "Apply install.yaml", "kubernetes.core.k8s": {
            "kubeconfig": kubeconfig, "apply": True, "src": str(INSTALL_YAML)}}]}]
    proc = run_playbook(tmp_path, inventory, play)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rendered = by_kind(yaml.safe_load_all(INSTALL_YAML.read_text()))
    stored = stored_objects(api_server)
    assert sorted(stored) == sorted(rendered)
    for kind, obj in rendered.items():
        assert as_applied(stored[kind]) == obj, kind
    again = run_playbook(tmp_path, inventory, play)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout


def test_the_chart_version_is_the_collections():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert chart["version"] == chart["appVersion"] == galaxy["version"]
