"""The agent the way a pod runs it: no kubeconfig, the service account files at their in-cluster path
(a private mount namespace, test-environment 13), HTTPS with a CA the test made, a rotating token."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess

import pytest

from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import (
    PROFILE, Cluster, agent_state, wait_for)
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ApiServer

SECRETS = "/run/secrets"
SA_PATH = SECRETS + "/kubernetes.io/serviceaccount"
POD_MOUNTS = ('mount -t tmpfs tmpfs %s && mkdir -p %s && mount --bind "$SA_DIR" %s && exec "$@"'
              % (SECRETS, SA_PATH, SA_PATH))

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("openssl"),
                                reason="needs root, util-linux unshare and openssl")


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


def make_ca_and_server_cert(directory):
    """ca.crt (CA:TRUE) and server.crt/server.key for IP:127.0.0.1 signed by it."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.crt", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver", "-keyout", "server.key",
            "-out", "server.csr", cwd=directory)
    (directory / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", "server.crt", "-extfile", "ext.cnf", cwd=directory)


@pytest.fixture
def secrets_mountpoint():
    """/run/secrets must exist to mount over it in the private namespace; removed again if we made it."""
    made = not os.path.exists(SECRETS)
    if made:
        os.mkdir(SECRETS)
    yield
    if made:
        os.rmdir(SECRETS)


def test_in_cluster_service_account_over_https_with_a_rotating_token(gpusim_node, start_agent, tmp_path,
                                                                     secrets_mountpoint):
    pki = tmp_path / "pki"
    pki.mkdir()
    make_ca_and_server_cert(pki)
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text("token-1")
    (sa_dir / "namespace").write_text("vgpu-agent")
    shutil.copy(pki / "ca.crt", sa_dir / "ca.crt")
    state = tmp_path / "state.json"
    state.write_text(json.dumps(agent_state()))
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    server = ApiServer.start("--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key"),
                             "--token", "token-1", "--state", str(state), context=context)
    try:
        cluster = Cluster(server)
        node = gpusim_node("l40s:1")
        agent = start_agent(node, None, argv_prefix=["unshare", "-m", "--propagation", "private", "sh", "-c",
                                                     POD_MOUNTS, "sh"],
                            SA_DIR=sa_dir, KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=server.port,
                            NAMESPACE=None, KUBECONFIG=None)
        agent.wait("success", "default")
        assert cluster.profile_labels() == {PROFILE + "L40S-24Q": "2"}
        assert not os.path.exists(SA_PATH)  # the files were only visible inside the agent's namespace
        log = server.log()
        assert {r["auth"] for r in log} == {"Bearer"}
        assert [r["path"] for r in log if r["method"] == "POST"] == ["/api/v1/namespaces/vgpu-agent/events"]

        # the kubelet rotates the token: the server takes only the new one, the agent reads it again
        (sa_dir / "token").write_text("token-2")
        server.control("token", {"token": "token-2"})
        agent.forget_status()
        cluster.select("L40S-12Q")
        agent.wait("success", "L40S-12Q")
        assert cluster.profile_labels() == {PROFILE + "L40S-12Q": "4"}
        assert "401" not in agent.output() and "Unauthorized" not in agent.output()
    finally:
        server.stop()


def test_a_server_certificate_from_another_ca_is_refused(gpusim_node, start_agent, tmp_path, secrets_mountpoint):
    trusted, other = tmp_path / "trusted", tmp_path / "other"
    for directory in (trusted, other):
        directory.mkdir()
        make_ca_and_server_cert(directory)
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text("t")
    shutil.copy(trusted / "ca.crt", sa_dir / "ca.crt")
    state = tmp_path / "state.json"
    state.write_text(json.dumps(agent_state()))
    server = ApiServer.start("--tls-cert", str(other / "server.crt"), "--tls-key", str(other / "server.key"),
                             "--state", str(state), context=ssl.create_default_context(cafile=str(other / "ca.crt")))
    try:
        agent = start_agent(gpusim_node("l40s:1"), None, argv_prefix=["unshare", "-m", "--propagation", "private",
                                                                      "sh", "-c", POD_MOUNTS, "sh"],
                            SA_DIR=sa_dir, KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=server.port,
                            KUBECONFIG=None)
        wait_for("a TLS verification error", lambda: "CERTIFICATE_VERIFY_FAILED" in agent.output(), timeout=20)
        assert agent.proc.poll() is None  # it keeps trying, with backoff
        assert server.log() == []  # no request got through
    finally:
        server.stop()
