"""The real node's network on this machine, and its removal.

- The node's address ``NODE_IP`` sits on a veth whose peer lives in a network namespace of its own
  (the "sink"): this kernel may lack the ``dummy`` link type, and the sink gives unserved Service
  addresses and KWOK's fake pod addresses a route that ends here instead of the default route.
- Pods live on the CNI bridge; they are not masqueraded, and the ``RADIXSERVE-FORWARD`` chain drops
  whatever a pod sends anywhere but pods, the node and Services.
- The sysctls we change are recorded first and restored by ``teardown``, together with every
  ``KUBE-*``, ``CNI-*`` and ``RADIXSERVE-*`` chain (kube-proxy's, the kubelet's, the portmap
  plugin's and ours), the ``cni-*`` namespaces containerd left and the links.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from .node_config import BRIDGE, NODE_IP, NODE_SUBNET, POD_CIDR, SINK_IP

NODE_LINK = "rsv-node"
SINK_LINK = "rsv-sinkp"
SINK_NS = "rsv-sink"
FORWARD_CHAIN = "RADIXSERVE-FORWARD"
CHAIN_PREFIXES = ("KUBE-", "CNI-", "RADIXSERVE-")
TABLES = ("filter", "nat", "mangle")
SYSCTLS = {
    "net/ipv4/ip_forward": "1",
    "net/bridge/bridge-nf-call-iptables": "1",
}
# The kubelet sets these itself (protectKernelDefaults off): recorded so that down restores them.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")


class NetError(RuntimeError):
    """A network step failed; the message names the command and its output."""


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        proc = subprocess.CompletedProcess(args, 127, "", f"{args[0]}: not found")
    if check and proc.returncode != 0:
        raise NetError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key


def _read_sysctl(key: str) -> str | None:
    try:
        return _sysctl_path(key).read_text().strip()
    except OSError:
        return None


def _write_sysctl(key: str, value: str) -> None:
    _sysctl_path(key).write_text(value + "\n")


def setup(files: Path, service_cidr: str, sink_cidrs: tuple[str, ...]) -> None:
    """Create the node's link, the sink, routes, sysctls and the forward chain (idempotent)."""
    files.mkdir(parents=True, exist_ok=True)
    saved = files / "sysctl.json"
    _run("modprobe", "br_netfilter", check=False)  # built in, or a module: either is fine
    if not saved.exists():
        keys = (*SYSCTLS, *KUBELET_SYSCTLS)
        saved.write_text(json.dumps({k: _read_sysctl(k) for k in keys}, indent=1) + "\n")
    for key, value in SYSCTLS.items():
        if _read_sysctl(key) is None:
            raise NetError(f"/proc/sys/{key} is missing: the kernel lacks br_netfilter, which "
                           "kube-proxy needs to route Services between pods on one bridge")
        _write_sysctl(key, value)
    if _run("ip", "netns", "exec", SINK_NS, "true", check=False).returncode != 0:
        _run("ip", "netns", "add", SINK_NS)
    if _run("ip", "link", "show", NODE_LINK, check=False).returncode != 0:
        _run("ip", "link", "add", NODE_LINK, "type", "veth", "peer", "name", SINK_LINK)
        _run("ip", "link", "set", SINK_LINK, "netns", SINK_NS)
        _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", NODE_LINK)
        _run("ip", "-n", SINK_NS, "addr", "add", f"{SINK_IP}/24", "dev", SINK_LINK)
    _run("ip", "link", "set", NODE_LINK, "up")
    _run("ip", "-n", SINK_NS, "link", "set", SINK_LINK, "up")
    _run("ip", "-n", SINK_NS, "link", "set", "lo", "up")
    for cidr in (service_cidr, *sink_cidrs):
        _run("ip", "route", "replace", cidr, "via", SINK_IP, "dev", NODE_LINK)
    _forward_chain(service_cidr)


def _forward_chain(service_cidr: str) -> None:
    if _run("iptables", "-t", "filter", "-S", FORWARD_CHAIN, check=False).returncode != 0:
        _run("iptables", "-t", "filter", "-N", FORWARD_CHAIN)
    _run("iptables", "-t", "filter", "-F", FORWARD_CHAIN)
    for dst in (POD_CIDR, NODE_SUBNET, service_cidr):
        _run("iptables", "-t", "filter", "-A", FORWARD_CHAIN, "-d", dst, "-j", "RETURN")
    _run("iptables", "-t", "filter", "-A", FORWARD_CHAIN, "-m", "conntrack", "--ctstate",
         "RELATED,ESTABLISHED", "-j", "RETURN")
    _run("iptables", "-t", "filter", "-A", FORWARD_CHAIN, "-j", "DROP")
    jump = ("FORWARD", "-s", POD_CIDR, "-j", FORWARD_CHAIN)
    if _run("iptables", "-t", "filter", "-C", *jump, check=False).returncode != 0:
        _run("iptables", "-t", "filter", "-I", *jump)


def _remove_chains(tool: str) -> list[str]:
    """Delete our prefixes' chains and every jump to them; returns what could not be removed."""
    problems = []
    for table in TABLES:
        listed = _run(tool, "-t", table, "-S", check=False)
        if listed.returncode != 0:
            continue
        rules = listed.stdout.splitlines()
        ours = [r.split()[1] for r in rules if r.startswith("-N ") and r.split()[1].startswith(
            CHAIN_PREFIXES)]
        for rule in rules:
            parts = shlex.split(rule)  # comments are quoted: "kubernetes service portals"
            if parts[:1] != ["-A"] or parts[1] in ours:
                continue
            if "-j" in parts and parts[parts.index("-j") + 1] in ours:
                _run(tool, "-t", table, "-D", *parts[1:], check=False)
        for chain in ours:
            _run(tool, "-t", table, "-F", chain, check=False)
        for chain in ours:
            if _run(tool, "-t", table, "-X", chain, check=False).returncode != 0:
                problems.append(f"{tool} -t {table} chain {chain}")
    return problems


def teardown(files: Path, service_cidr: str, sink_cidrs: tuple[str, ...]) -> list[str]:
    """Undo ``setup`` and what kube-proxy, the kubelet and CNI left; returns what remains."""
    problems: list[str] = []
    for cidr in (service_cidr, *sink_cidrs):
        _run("ip", "route", "del", cidr, check=False)
    for tool in ("iptables", "ip6tables"):
        problems += _remove_chains(tool)
    for name in _run("ip", "netns", "list", check=False).stdout.split():
        if name.startswith("cni-"):
            _run("ip", "netns", "delete", name, check=False)
    _run("ip", "link", "delete", NODE_LINK, check=False)
    _run("ip", "link", "delete", BRIDGE, check=False)
    _run("ip", "netns", "delete", SINK_NS, check=False)
    saved = files / "sysctl.json"
    if saved.exists():
        for key, value in json.loads(saved.read_text()).items():
            if value is not None and _read_sysctl(key) not in (None, value):
                try:
                    _write_sysctl(key, value)
                except OSError as e:
                    problems.append(f"sysctl {key}: {e}")
        saved.unlink()
    return problems + leftovers()


def leftovers() -> list[str]:
    """What of the node's network still exists on this machine."""
    left = []
    for link in (NODE_LINK, BRIDGE):
        if _run("ip", "link", "show", link, check=False).returncode == 0:
            left.append(f"link {link}")
    namespaces = _run("ip", "netns", "list", check=False).stdout.split()
    left += [f"netns {n}" for n in namespaces if n == SINK_NS or n.startswith("cni-")]
    for table in TABLES:
        listed = _run("iptables", "-t", table, "-S", check=False).stdout.splitlines()
        left += [f"iptables -t {table} {r}" for r in listed
                 if r.startswith("-N ") and r.split()[1].startswith(CHAIN_PREFIXES)]
    return left
