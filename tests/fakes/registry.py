"""A real registry on 127.0.0.1 for push tests: Debian's docker-registry (distribution 2.8) with htpasswd auth.

    with LocalRegistry(tmp_path) as registry:      # registry.host == "127.0.0.1:<port>"
        ...podman push --tls-verify=false ...
        registry.tags("accelops/vgpu-manager")    # GET /v2/<name>/tags/list with the credentials
"""

import base64
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import bcrypt

BINARY = "/usr/bin/docker-registry"
USERNAME = "accelops-builder"

CONFIG = """version: 0.1
log: {{level: warn}}
storage:
  filesystem: {{rootdirectory: {storage}}}
  delete: {{enabled: true}}
http: {{addr: "127.0.0.1:{port}"}}
auth:
  htpasswd: {{realm: accelops-tests, path: {htpasswd}}}
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalRegistry:
    def __init__(self, directory, username=USERNAME, password=None):
        self.directory = str(directory)
        self.username = username
        self.password = password or base64.b32encode(os.urandom(10)).decode().lower()
        self.port = free_port()
        self.host = "127.0.0.1:%d" % self.port
        self.process = None

    def start(self, timeout=15):
        os.makedirs(os.path.join(self.directory, "storage"), exist_ok=True)
        htpasswd = os.path.join(self.directory, "htpasswd")
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=5)).decode()
        with open(htpasswd, "w", encoding="utf-8") as handle:  # bcrypt: the only hash distribution accepts
            handle.write("%s:%s\n" % (self.username, hashed))
        config = os.path.join(self.directory, "config.yml")
        with open(config, "w", encoding="utf-8") as handle:
            handle.write(CONFIG.format(storage=os.path.join(self.directory, "storage"), port=self.port,
                                       htpasswd=htpasswd))
        log = open(os.path.join(self.directory, "registry.log"), "w", encoding="utf-8")  # noqa: SIM115
        self.process = subprocess.Popen([BINARY, "serve", config], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("docker-registry exited: %s" % self.log())
            try:
                urllib.request.urlopen("http://%s/v2/" % self.host, timeout=1)
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("docker-registry did not answer on %s: %s" % (self.host, self.log()))

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self):
        with open(os.path.join(self.directory, "registry.log"), encoding="utf-8") as handle:
            return handle.read()[-2000:]

    def get(self, path):
        """JSON of GET /v2/<path> with the registry's credentials."""
        token = base64.b64encode(("%s:%s" % (self.username, self.password)).encode()).decode()
        request = urllib.request.Request("http://%s/v2/%s" % (self.host, path),
                                         headers={"Authorization": "Basic " + token})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def tags(self, repository):
        try:
            return sorted(self.get("%s/tags/list" % repository).get("tags") or [])
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
