# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The cluster-side modules' connection options: the same names, aliases and K8S_AUTH_*
    # environment variables as kubernetes.core (doc fragment k8s_auth_options), so
    # module_defaults written for kubernetes.core carry over. The write options are k8s_write.
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path to a kubeconfig file, several paths separated by C(:), or the kubeconfig content as a
        dictionary.
      - Without O(kubeconfig), O(host) or O(api_key), the in-cluster service account is tried, then
        C(~/.kube/config).
      - Tokens, passwords and key data of a dictionary kubeconfig never appear in the module output.
      - Can also be set with E(K8S_AUTH_KUBECONFIG).
    type: raw
  context:
    description:
      - The kubeconfig context to use. Can also be set with E(K8S_AUTH_CONTEXT).
    type: str
  host:
    description:
      - URL of the Kubernetes API server. Can also be set with E(K8S_AUTH_HOST).
    type: str
  api_key:
    description:
      - Bearer token for the API server. Can also be set with E(K8S_AUTH_API_KEY).
    type: str
  username:
    description:
      - User name for basic authentication. Can also be set with E(K8S_AUTH_USERNAME).
    type: str
  password:
    description:
      - Password for basic authentication. Can also be set with E(K8S_AUTH_PASSWORD).
    type: str
  validate_certs:
    description:
      - Whether to verify the API server's TLS certificate.
      - Can also be set with E(K8S_AUTH_VERIFY_SSL).
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description:
      - CA certificate that signed the API server's certificate.
      - Can also be set with E(K8S_AUTH_SSL_CA_CERT).
    type: path
    aliases: [ssl_ca_cert]
  client_cert:
    description:
      - Client certificate for TLS authentication. Can also be set with E(K8S_AUTH_CERT_FILE).
    type: path
    aliases: [cert_file]
  client_key:
    description:
      - Client key for TLS authentication. Can also be set with E(K8S_AUTH_KEY_FILE).
    type: path
    aliases: [key_file]
  proxy:
    description:
      - HTTP proxy URL for API requests. Can also be set with E(K8S_AUTH_PROXY).
    type: str
  no_proxy:
    description:
      - Comma-separated hosts, domains, IPs or CIDRs to reach without the proxy.
      - Can also be set with E(K8S_AUTH_NO_PROXY).
    type: str
  proxy_headers:
    description:
      - Headers sent to the proxy.
    type: dict
    suboptions:
      proxy_basic_auth:
        description:
          - C(user:password) for the proxy. Can also be set with E(K8S_AUTH_PROXY_HEADERS_PROXY_BASIC_AUTH).
        type: str
      basic_auth:
        description:
          - C(user:password) basic authentication header. Can also be set with
            E(K8S_AUTH_PROXY_HEADERS_BASIC_AUTH).
        type: str
      user_agent:
        description:
          - User-Agent header. Can also be set with E(K8S_AUTH_PROXY_HEADERS_USER_AGENT).
        type: str
  persist_config:
    description:
      - Write refreshed tokens (for example OIDC) back to the kubeconfig file.
      - Can also be set with E(K8S_AUTH_PERSIST_CONFIG).
    type: bool
  impersonate_user:
    description:
      - User to impersonate. Can also be set with E(K8S_AUTH_IMPERSONATE_USER).
    type: str
  impersonate_groups:
    description:
      - Group to impersonate, a list with one element (the C(kubernetes) Python client sends a
        single C(Impersonate-Group) header; more than one group is rejected).
      - Can also be set with E(K8S_AUTH_IMPERSONATE_GROUPS) (comma-separated).
    type: list
    elements: str
requirements:
  - python >= 3.9
  - kubernetes >= 28.1.0
notes:
  - The module talks to the API from the controller (or wherever it runs); delegate it to
    C(localhost) from node plays.
  - Set defaults for all cluster modules at once with
    C(module_defaults) and C(group/accelops.vgpu.cluster).
"""
