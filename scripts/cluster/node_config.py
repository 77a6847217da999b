"""The real node's configuration files: containerd, the CNI network, kubelet, kube-proxy, CoreDNS.

Pure functions from the node's :class:`Layout` to file contents; ``node.py`` writes them (only when
they change: kube-proxy exits when its config file is rewritten under it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

NODE_NAME = "radixserve-node"
NODE_IP = "10.200.0.1"  # on a veth of our own; its peer (.2) sits in the sink namespace
SINK_IP = "10.200.0.2"
NODE_SUBNET = "10.200.0.0/24"
POD_CIDR = "10.244.0.0/24"
BRIDGE = "rsv-cni0"
CLUSTER_DOMAIN = "cluster.local"
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
PROXY_HEALTHZ_PORT = 10256
PROXY_METRICS_PORT = 10249
DNS_HEALTH_PORT = 10253
DNS_READY_PORT = 10254
RUN_DIR = Path("/run/radixserve-node")  # containerd's socket and state: a tmpfs, like /run/containerd
SANDBOX_IMAGE = "localhost/radixserve-pause:3.10"


@dataclass(frozen=True)
class Layout:
    """Where the node keeps things. ``state`` goes with the cluster; ``images`` (containerd's root:
    content and snapshots) outlives it, so images are imported once per machine."""

    state: Path
    images: Path

    @property
    def socket(self) -> Path:
        return RUN_DIR / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return RUN_DIR / "state"

    @property
    def kubelet_root(self) -> Path:
        return self.state / "kubelet"

    @property
    def cni_conf_dir(self) -> Path:
        return self.state / "cni"

    @property
    def files(self) -> Path:
        return self.state / "node"


def containerd_toml(layout: Layout, cni_bin_dir: str) -> str:
    return f"""\
version = 2
root = "{layout.images}"
state = "{layout.containerd_state}"

[grpc]
  address = "{layout.socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  # NOTE: without CAP_SYS_RESOURCE (VMs like CI's) runc cannot lower oom_score_adj and every
  # sandbox fails with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin_dir}"
    conf_dir = "{layout.cni_conf_dir}"
"""


def cni_conflist(layout: Layout) -> str:
    """A bridge with host-local addresses (kept in the state dir); no masquerade: pods reach pods,
    the node and Services."""
    return json.dumps({
        "cniVersion": "0.4.0",
        "name": "radixserve",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                         "routes": [{"dst": "0.0.0.0/0"}],
                         "dataDir": str(layout.state / "cni-ipam")},
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=2) + "\n"


def kubelet_yaml(layout: Layout, ca_file: Path) -> str:
    return f"""\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: {KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: {NODE_IP}
healthzPort: {KUBELET_HEALTHZ_PORT}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: "{ca_file}"}}
authorization: {{mode: AlwaysAllow}}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{layout.socket}
clusterDNS: [{NODE_IP}]
clusterDomain: {CLUSTER_DOMAIN}
resolvConf: "{layout.files / 'resolv.conf'}"
# Images are imported, never pulled: garbage collection would throw them away on a full disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"}}
serializeImagePulls: false
maxPods: 50
"""


def kube_proxy_yaml(kubeconfig: Path) -> str:
    return f"""\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {{kubeconfig: "{kubeconfig}"}}
hostnameOverride: {NODE_NAME}
bindAddress: {NODE_IP}
healthzBindAddress: {NODE_IP}:{PROXY_HEALTHZ_PORT}
metricsBindAddress: {NODE_IP}:{PROXY_METRICS_PORT}
clusterCIDR: {POD_CIDR}
nodePortAddresses: ["{NODE_SUBNET}"]
# Leave the machine's conntrack sysctls alone.
conntrack: {{maxPerCore: 0, min: 0}}
"""


def corefile(kubeconfig: Path) -> str:
    return f"""\
{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {NODE_IP}
    errors
    health {NODE_IP}:{DNS_HEALTH_PORT}
    ready {NODE_IP}:{DNS_READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""


def resolv_conf() -> str:
    """For pods with dnsPolicy Default: the cluster's resolver too, never the machine's."""
    return f"nameserver {NODE_IP}\n"
