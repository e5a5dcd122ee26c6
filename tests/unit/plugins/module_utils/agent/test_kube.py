import base64
import json

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import kube


def test_in_cluster_with_an_unusable_ca_is_a_startup_error(tmp_path):
    (tmp_path / "token").write_text("first\n")
    (tmp_path / "namespace").write_text("vgpu-agent")
    (tmp_path / "ca.crt").write_text("")
    with pytest.raises(kube.KubeConfigError, match="cannot load .*ca.crt"):
        kube.in_cluster(str(tmp_path), {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})


def test_in_cluster_needs_the_service_host_and_the_account_files(tmp_path):
    with pytest.raises(kube.KubeConfigError, match="KUBERNETES_SERVICE_HOST is not set"):
        kube.in_cluster(str(tmp_path), {})
    with pytest.raises(kube.KubeConfigError, match="token is missing"):
        kube.in_cluster(str(tmp_path), {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})


def write_config(path, user, cluster=None):
    path.write_text(json.dumps({
        "current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ns"}}],
        "clusters": [{"name": "k", "cluster": dict({"server": "http://127.0.0.1:8080"}, **(cluster or {}))}],
        "users": [{"name": "u", "user": user}]}))
    return str(path)


def test_kubeconfig_token_file_is_read_again_each_time(tmp_path):
    (tmp_path / "tok").write_text("one")
    creds = kube.from_kubeconfig(write_config(tmp_path / "kc", {"tokenFile": "tok"}))
    assert (creds.server, creds.namespace, creds.bearer()) == ("http://127.0.0.1:8080", "ns", "one")
    (tmp_path / "tok").write_text("two\n")
    assert creds.bearer() == "two"


def test_kubeconfig_inline_token_and_bad_inputs(tmp_path):
    assert kube.from_kubeconfig(write_config(tmp_path / "kc", {"token": "t"})).bearer() == "t"
    with pytest.raises(kube.KubeConfigError, match="no context named"):
        (tmp_path / "bad").write_text(json.dumps({"current-context": "x", "contexts": []}))
        kube.from_kubeconfig(str(tmp_path / "bad"))
    with pytest.raises(kube.KubeConfigError, match="is not an http"):
        kube.from_kubeconfig(write_config(tmp_path / "kc2", {"token": "t"}, {"server": "ftp://x"}))
    with pytest.raises(kube.KubeConfigError, match="cannot load its certificates"):
        kube.from_kubeconfig(write_config(tmp_path / "kc3", {"token": "t"}, {
            "server": "https://127.0.0.1:6443", "certificate-authority-data": base64.b64encode(b"junk").decode()}))


def test_an_unreachable_server_is_kube_unavailable_in_one_line(tmp_path):
    client = kube.KubeClient(kube.Credentials("http://127.0.0.1:9"), timeout=2)
    with pytest.raises(kube.KubeUnavailable, match="^GET /api/v1/nodes/gpu-a: no answer from http://127.0.0.1:9"):
        client.get_node("gpu-a")


def test_a_token_file_that_vanished_is_retried_like_an_absent_server(tmp_path):
    creds = kube.Credentials("http://127.0.0.1:9", token_file=str(tmp_path / "token"))
    with pytest.raises(kube.KubeUnavailable, match="cannot read the token .*token"):
        creds.bearer()


class Headers(dict):
    def get(self, key, default=None):
        return dict.get(self, key, default)


def test_retry_after_reads_the_header_then_the_status_details():
    status = json.dumps({"kind": "Status", "code": 429, "details": {"retryAfterSeconds": 3}}).encode()
    assert kube.retry_after(Headers({"Retry-After": "5"}), status) == 5.0         # the header wins
    assert kube.retry_after(Headers(), status) == 3.0                              # apimachinery's Status
    assert kube.retry_after(Headers({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}), b"") == 0.0  # past date
    assert kube.retry_after(Headers({"Retry-After": "99999"}), b"") == kube.RETRY_AFTER_CAP
    assert kube.retry_after(Headers({"Retry-After": "soon"}), b"not json") is None
    assert kube.retry_delay(kube.KubeApiError("x", 429, retry_after=9.0), 1.0) == 9.0
    assert kube.retry_delay(kube.KubeApiError("x", 503), 4.0) == 4.0


def test_a_throttled_answer_carries_retry_after(tmp_path):
    import http.server
    import threading

    class Throttle(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps({"kind": "Status", "code": 429, "reason": "TooManyRequests",
                               "message": "Too many requests, please try again later."}).encode()
            self.send_response(429)
            self.send_header("Retry-After", "4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Throttle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = kube.KubeClient(kube.Credentials("http://127.0.0.1:%d" % server.server_port), timeout=5)
        with pytest.raises(kube.KubeApiError) as caught:
            client.get_node("gpu-a")
        assert (caught.value.status, caught.value.retry_after) == (429, 4.0)
    finally:
        server.shutdown()
