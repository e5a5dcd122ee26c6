"""Auth options -> client configuration, secret extraction, the cluster modules' main()."""

from __future__ import annotations

import json

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster import k8s_client as kc


def test_env_vars_fill_unset_options_including_client_names():
    env = {"K8S_AUTH_HOST": "https://api:6443", "K8S_AUTH_VERIFY_SSL": "no", "K8S_AUTH_SSL_CA_CERT": "/ca.pem",
           "K8S_AUTH_IMPERSONATE_GROUPS": "admins", "K8S_AUTH_PROXY_HEADERS_USER_AGENT": "ua"}
    auth = kc.auth_from_params({"host": None, "api_key": "tok", "validate_certs": None}, env)
    assert auth["host"] == "https://api:6443" and auth["validate_certs"] is False
    assert auth["ca_cert"] == "/ca.pem" and auth["impersonate_groups"] == ["admins"]
    assert auth["proxy_headers"] == {"user_agent": "ua"} and auth["api_key"] == "tok"
    assert kc.auth_from_params({"host": "https://given"}, env)["host"] == "https://given"


def test_configuration_from_explicit_options():
    config = kc.build_configuration(kc.auth_from_params(
        {"host": "https://api:6443", "api_key": "tok", "validate_certs": False, "ca_cert": "/ca.pem",
         "proxy": "http://proxy:3128", "proxy_headers": {"proxy_basic_auth": "u:p"}}, {}))
    assert config.host == "https://api:6443" and config.verify_ssl is False and config.ssl_ca_cert == "/ca.pem"
    assert config.api_key == {"authorization": "Bearer tok"} and config.proxy == "http://proxy:3128"
    assert config.proxy_headers["proxy-authorization"].startswith("Basic ")


def test_dict_kubeconfig_and_its_secrets():
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                  "clusters": [{"name": "k", "cluster": {"server": "https://k:6443"}}],
                  "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                  "users": [{"name": "u", "user": {"token": "T0K", "client-key-data": "S0ME"}}]}
    config = kc.build_configuration(kc.auth_from_params({"kubeconfig": kubeconfig}, {}))
    assert config.host == "https://k:6443"
    assert sorted(kc.kubeconfig_secrets(kubeconfig)) == ["S0ME", "T0K"]
    assert kc.kubeconfig_secrets("/path/to/file") == []


def good_kubeconfig():
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": "https://k:6443"}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "T0K"}}]}


@pytest.mark.parametrize("change,reason", [
    (lambda d: d.update(clusters="k"), "clusters is str, not a list"),
    (lambda d: d.update(users={"u": {"token": "T0K"}}), "users is dict, not a list"),
    (lambda d: d.update(users=["T0K"]), "users[0] is not a mapping with a name"),
    (lambda d: d["users"][0].update(user="T0K"), "users[0] ('u') has no user mapping"),
    (lambda d: d.update(contexts=[{"name": "c", "context": "k"}]), "contexts[0] ('c') has no context mapping"),
    (lambda d: d.pop("contexts"), "context 'c' is not one of its contexts (none)"),
    (lambda d: d.pop("current-context"), "no context to use"),
    (lambda d: d.update({"current-context": "nope"}), "context 'nope' is not one of its contexts ('c')"),
    (lambda d: d["contexts"][0]["context"].update(cluster="gone"), "names cluster 'gone'"),
    (lambda d: d["contexts"][0]["context"].update(user=["T0K"]), "context 'c': user is list"),
    (lambda d: d.clear() or d.update(kind=["T0K"]), "no context to use"),
])
def test_malformed_dict_kubeconfig_is_one_line_without_secrets(change, reason):
    kubeconfig = good_kubeconfig()
    change(kubeconfig)
    with pytest.raises(kc.K8sError) as err:
        kc.build_configuration(kc.auth_from_params({"kubeconfig": kubeconfig}, {}))
    message = str(err.value)
    assert message.startswith("kubeconfig (dict): ") and reason in message
    assert "\n" not in message and "T0K" not in message


@pytest.mark.parametrize("content,reason", [
    ("apiVersion: v1\nusers: [{name: u, user: {token: T0K}}\nclusters: [\n", "not valid YAML at line "),
    ("token: T0K: x\n", "not valid YAML at line 1"),
    ("- T0K\n", "not a kubeconfig mapping (top level is list)"),
    ("", "not a kubeconfig mapping (top level is NoneType)"),
    ("clusters: T0K\n", "clusters is str, not a list"),
])
def test_malformed_kubeconfig_file_is_one_line_naming_it(tmp_path, content, reason):
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    with pytest.raises(kc.K8sError) as err:
        kc.build_configuration(kc.auth_from_params({"kubeconfig": str(path)}, {}))
    message = str(err.value)
    assert message.startswith("kubeconfig %s: " % path) and reason in message
    assert "\n" not in message and "T0K" not in message


def test_a_valid_kubeconfig_file_with_a_chosen_context_loads(tmp_path):
    path = tmp_path / "kubeconfig"
    kubeconfig = good_kubeconfig()
    kubeconfig["contexts"].append({"name": "other", "context": {"cluster": "k"}})
    path.write_text(json.dumps(kubeconfig))
    config = kc.build_configuration(kc.auth_from_params({"kubeconfig": str(path), "context": "other"}, {}))
    assert config.host == "https://k:6443"
    assert kc.kubeconfig_problem(kubeconfig, "other") is None


def test_two_impersonated_groups_are_rejected():
    with pytest.raises(kc.K8sError, match="impersonate_groups .* only one group"):
        kc.new_api_client(kc.auth_from_params({"host": "http://x", "impersonate_groups": ["a", "b"]}, {}))


def test_cluster_module_glue_folds_a_multi_line_engine_error():
    class Module:
        params = {"host": "http://127.0.0.1:9", "kubeconfig": None}
        check_mode, _diff, no_log_values = False, False, set()

        def fail_json(self, **result):
            raise SystemExit(result)

    def engine(api, params, check_mode):
        raise kc.K8sError("Node gpu-a: first\nsecond")

    with pytest.raises(SystemExit) as exited:
        kc.run_cluster_module(Module(), engine, "kubernetes missing")
    assert exited.value.args[0] == {"msg": "Node gpu-a: first\\nsecond"}
