"""Start, check and stop the local control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, on loopback, state in ``.cluster/`` at the repo root.

``up`` is idempotent: it starts only what is not running and healthy, creates the fake nodes that
are missing and returns a :class:`Cluster`. ``down`` stops every process it started (pidfiles,
process groups) and removes the state directory.

State dir (``$RADIXSERVE_CLUSTER_DIR``, default ``<repo>/.cluster``)::

    kubeconfig          admin kubeconfig for you and the tests (context radixserve-local)
    state.json          chosen loopback ports
    pki/                CA, serving/client certs, service-account keys, components' kubeconfig
    etcd/               etcd data
    kwok.yaml           KWOK's stages
    run/<name>.pid      pidfiles; logs/<name>.log: each process's output
    node/, kubelet/, cni/  the real node's files (``node.py``), where it runs

With the real node on, the API server listens on the node's address (pods reach it through the
``kubernetes`` Service) and the fake nodes are tainted, so plain pods run on the real node.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import build, kwok, node, pki, procs
from .kube import Api, ApiError, http_ok

REPO_ROOT = Path(__file__).resolve().parents[2]
MARKER = ".radixserve-cluster"
CONTEXT = "radixserve-local"
SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
PORT_NAMES = ("etcd_client", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok")
ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


class ClusterError(RuntimeError):
    """The control plane could not be brought up; the message says which part and why."""


@dataclass(frozen=True)
class Cluster:
    """A running local control plane."""

    state_dir: Path
    kubeconfig: Path
    kubectl: Path
    server: str
    bin_dir: Path
    nodes: tuple[str, ...] = field(default=())
    real_node: str | None = None  # the real node's name, when it runs

    def env(self) -> dict[str, str]:
        """``os.environ`` with ``KUBECONFIG`` pointing at this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl_run(self, *args: str, check: bool = True, input: str | None = None,
                    timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl --kubeconfig … args``; text output captured."""
        return subprocess.run(
            [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            check=check, capture_output=True, text=True, input=input, timeout=timeout,
        )


def state_dir(root: Path | None = None) -> Path:
    env = os.environ.get("RADIXSERVE_CLUSTER_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return (root or REPO_ROOT).resolve() / ".cluster"


def unavailable_reason() -> str | None:
    """Why a local control plane can't be made here (e.g. "go not found …"), or None."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return "the Python package `cryptography` is missing (pip install cryptography)"
    return build.unavailable_reason()


# --- state ----------------------------------------------------------------------------------------


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _all_free(ports) -> bool:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's listeners do
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _load_state(state: Path) -> dict:
    try:
        loaded = json.loads((state / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _host(state: Path) -> str:
    """The API server's address: the node's when the real node runs, loopback otherwise."""
    return str(_load_state(state).get("host") or "127.0.0.1")


def _load_ports(state: Path) -> dict[str, int] | None:
    try:
        ports = _load_state(state)["ports"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(ports, dict) or set(ports) != set(PORT_NAMES):
        return None
    return {k: int(v) for k, v in ports.items()}


def _save_state(state: Path, ports: dict[str, int], host: str) -> None:
    (state / "state.json").write_text(json.dumps(
        {"ports": ports, "host": host, "kubernetes": build.K8S_VERSION,
         "etcd": build.ETCD_VERSION, "kwok": build.KWOK_VERSION}, indent=2) + "\n")


def _kubeconfig_text(server: str, p: pki.Pki) -> str:
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return f"""\
apiVersion: v1
kind: Config
clusters:
- name: {CONTEXT}
  cluster:
    server: {server}
    certificate-authority-data: {b64(p.ca_crt)}
users:
- name: admin
  user:
    client-certificate-data: {b64(p.admin_crt)}
    client-key-data: {b64(p.admin_key)}
contexts:
- name: {CONTEXT}
  context:
    cluster: {CONTEXT}
    user: admin
    namespace: default
current-context: {CONTEXT}
"""


# --- components -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Component:
    name: str
    argv: list[str]
    healthy: Callable[[], bool]
    timeout_s: float


def _apiserver_network(host: str, p: pki.Pki) -> list[str]:
    if host == "127.0.0.1":
        # The `kubernetes` Endpoints may not hold a loopback address; nothing here needs them.
        return ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none"]
    # Beside the real node: pods reach the API server through the `kubernetes` Service, and it
    # reaches the kubelet (logs, exec, port-forward) with a client certificate.
    return [f"--bind-address={host}", f"--advertise-address={host}",
            f"--kubelet-client-certificate={p.admin_crt}", f"--kubelet-client-key={p.admin_key}",
            "--kubelet-preferred-address-types=InternalIP,Hostname"]


def _components(state: Path, bins: Path, p: pki.Pki, ports: dict[str, int],
                api: Api, host: str) -> list[_Component]:
    kcfg = str(p.dir / "admin.kubeconfig")
    etcd_url = f"http://127.0.0.1:{ports['etcd_client']}"
    peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
    # No --authentication/authorization-kubeconfig: delegated auth would want a front-proxy
    # (requestheader) CA; /healthz is always allowed and nothing else is served to anyone.
    common = [f"--kubeconfig={kcfg}", "--leader-elect=false", "--bind-address=127.0.0.1"]
    return [
        _Component("etcd", [
            str(bins / "etcd"),
            "--name=radixserve",
            f"--data-dir={state / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=radixserve={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # a throwaway test cluster: speed over durability
            "--log-level=warn",
        ], lambda: http_ok(f"{etcd_url}/health"), 30.0),
        _Component("kube-apiserver", [
            str(bins / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--secure-port={ports['apiserver']}",
            *_apiserver_network(host, p),
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            f"--client-ca-file={p.ca_crt}",
            f"--tls-cert-file={p.apiserver_crt}",
            f"--tls-private-key-file={p.apiserver_key}",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            f"--service-account-issuer={SA_ISSUER}",
            "--allow-privileged=true",
        ], lambda: api.ok("/readyz"), 120.0),
        _Component("kube-controller-manager", [
            str(bins / "kube-controller-manager"),
            *common,
            f"--secure-port={ports['controller_manager']}",
            f"--service-account-private-key-file={p.sa_key}",
            f"--root-ca-file={p.ca_crt}",
            f"--cluster-signing-cert-file={p.ca_crt}",
            f"--cluster-signing-key-file={p.ca_key}",
            "--use-service-account-credentials=true",
            "--controllers=*",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
        ], lambda: http_ok(f"https://127.0.0.1:{ports['controller_manager']}/healthz"), 90.0),
        _Component("kube-scheduler", [
            str(bins / "kube-scheduler"),
            *common,
            f"--secure-port={ports['scheduler']}",
        ], lambda: http_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz"), 90.0),
        _Component("kwok", [
            str(bins / "kwok"),
            *kwok.args(p.dir / "admin.kubeconfig", state / "kwok.yaml", ports["kwok"],
                       beside_node=host != "127.0.0.1"),
        ], lambda: http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"), 60.0),
    ]


def _say(msg: str, t0: float, quiet: bool) -> None:
    if not quiet:
        print(f"[cluster {time.monotonic() - t0:5.1f}s] {msg}", flush=True)


def _wait(what: str, check: Callable[[], bool], timeout_s: float, state: Path,
          proc_name: str | None = None, binary: str | None = None) -> None:
    """Poll ``check`` until true; fail early if ``proc_name`` dies; log tail in the error."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return
        dead = proc_name is not None and procs.running(state, proc_name, binary) is None
        if dead or time.monotonic() > deadline:
            why = "exited" if dead else f"not ready after {timeout_s:.0f}s"
            msg = f"{what}: {why}"
            if proc_name is not None:
                log = procs.logfile(state, proc_name)
                msg += f"\n--- last lines of {log} ---\n{procs.tail(log)}"
            msg += f"\n(logs in {state / 'logs'}; `make cluster-down` cleans up)"
            raise ClusterError(msg)
        time.sleep(0.25)


def _prepare_state(state: Path) -> None:
    if state.exists() and any(state.iterdir()) and not (state / MARKER).exists():
        raise ClusterError(f"{state} exists and was not made by scripts.cluster; refusing to use it")
    state.mkdir(parents=True, exist_ok=True)
    (state / MARKER).write_text("state of `python -m scripts.cluster`; `make cluster-down` "
                                "removes this directory\n")


def up(root: Path | None = None, quiet: bool = False, real_node: bool | None = None) -> Cluster:
    """Bring the control plane up (building binaries on first use); starts only what is missing.

    ``real_node``: True needs the real node (an error says why it cannot run), False leaves it
    out, None (the default) runs it wherever ``node.unavailable_reason()`` allows.
    """
    t0 = time.monotonic()
    reason = unavailable_reason()
    if reason:
        raise ClusterError(reason)
    bins = build.ensure_binaries()
    state = state_dir(root)
    _prepare_state(state)
    with procs.locked(state / ".lock"):
        running = current(root)
        if running is not None and real_node is not None and (running.real_node is None) == real_node:
            have = "with" if running.real_node else "without"
            raise ClusterError(f"a cluster {have} the real node already runs in {state}; "
                               "`make cluster-down` first")
        if real_node is None:
            why_not = node.unavailable_reason()
            real_node = why_not is None if running is None else running.real_node is not None
            if why_not and not quiet:
                _say(f"no real node ({why_not}): fake nodes only", t0, quiet)
        elif real_node and node.unavailable_reason():
            raise ClusterError(f"no real node here: {node.unavailable_reason()}")
        return _up(state, bins, t0, quiet, real_node)


def _up(state: Path, bins: Path, t0: float, quiet: bool, real_node: bool) -> Cluster:
    p = pki.ensure(state / "pki")
    host = pki.NODE_IP if real_node else "127.0.0.1"
    if real_node:
        try:
            node.prepare_network(state, SERVICE_CIDR, (kwok.POD_CIDR_BESIDE_NODE,))
        except node.NodeError as e:
            raise ClusterError(str(e)) from None

    any_running = any(procs.running(state, n, n) for n in ORDER)
    ports = _load_ports(state)
    if ports is None or _host(state) != host or not (any_running or _all_free(ports.values())):
        # A fresh start (or the old ports are taken): new ports, and etcd's data goes with them,
        # since etcd keeps its peer URL in its data dir.
        ports = dict(zip(PORT_NAMES, _free_ports(len(PORT_NAMES)), strict=True))
        shutil.rmtree(state / "etcd", ignore_errors=True)
    _save_state(state, ports, host)
    server = f"https://{host}:{ports['apiserver']}"
    text = _kubeconfig_text(server, p)
    (p.dir / "admin.kubeconfig").write_text(text)
    (p.dir / "admin.kubeconfig").chmod(0o600)
    kubeconfig = state / "kubeconfig"
    if not kubeconfig.exists() or kubeconfig.read_text() != text:
        kubeconfig.write_text(text)
        kubeconfig.chmod(0o600)
    if kwok.write_config(state / "kwok.yaml") and procs.stop(state, "kwok", "kwok"):
        _say("kwok: stages changed, restarting it", t0, quiet)

    api = Api(server, p)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    for comp in _components(state, bins, p, ports, api, host):
        binary = os.path.basename(comp.argv[0])
        pid = procs.running(state, comp.name, binary)
        if pid is not None and comp.healthy():
            _say(f"{comp.name}: running (pid {pid})", t0, quiet)
            continue
        if pid is None:
            if comp.name == "etcd":
                (state / "etcd").mkdir(mode=0o700, exist_ok=True)
            if comp.name == "kwok":
                kwok.release_leases(api)
            pid = procs.start(state, comp.name, comp.argv, env)
            _say(f"{comp.name}: started (pid {pid}), waiting until healthy", t0, quiet)
        _wait(comp.name, comp.healthy, comp.timeout_s, state, comp.name, binary)
        _say(f"{comp.name}: healthy", t0, quiet)

    names = kwok.create_nodes(api, beside_node=real_node)
    _wait(f"fake nodes {', '.join(names)} Ready", lambda: not kwok.nodes_ready(api, names),
          60.0, state, "kwok", "kwok")
    _say(f"nodes Ready: {', '.join(names)}", t0, quiet)
    if real_node:
        try:
            node.up(state, bins, p.dir / "admin.kubeconfig", p.ca_crt, api,
                    lambda msg: _say(f"node: {msg}", t0, quiet))
        except (node.NodeError, OSError, subprocess.SubprocessError) as e:
            raise ClusterError(f"the real node: {e}\n(logs in {state / 'logs'}; "
                               "`make cluster-down` cleans up)") from None
        _say(f"node {node.NODE_NAME} Ready", t0, quiet)
    _wait("ServiceAccount default/default", lambda: _exists(
        api, "/api/v1/namespaces/default/serviceaccounts/default"), 90.0, state,
        "kube-controller-manager", "kube-controller-manager")
    _say(f"ready; kubeconfig: {kubeconfig}", t0, quiet)
    return Cluster(state, kubeconfig, bins / "kubectl", server, bins, tuple(names),
                   node.NODE_NAME if real_node else None)


def _exists(api: Api, path: str) -> bool:
    try:
        api.get(path)
        return True
    except (ApiError, OSError):
        return False


def down(root: Path | None = None, quiet: bool = False) -> list[str]:
    """Stop every process of the control plane and remove its state dir; returns what was stopped."""
    state = state_dir(root)
    stopped: list[str] = []
    if not state.exists():
        return stopped
    if not (state / MARKER).exists() and any(state.iterdir()):
        if not quiet:
            print(f"[cluster] {state} has no {MARKER} marker; left alone", flush=True)
        return stopped
    left: list[str] = []
    with procs.locked(state / ".lock"):
        had_node = node.is_on(state) or any(procs.running(state, n, n) for n in node.ORDER)
        if had_node:
            api = _api(state)
            left = node.down(state, api, SERVICE_CIDR, (kwok.POD_CIDR_BESIDE_NODE,),
                             lambda msg: None if quiet else print(f"[cluster] node: {msg}",
                                                                  flush=True))
        for name in reversed(ORDER):
            if procs.stop(state, name, name):
                stopped.append(name)
                if not quiet:
                    print(f"[cluster] stopped {name}", flush=True)
        if had_node:  # (a node of another state dir is not this cluster's to judge)
            left += node.leftovers(state)
        shutil.rmtree(state, ignore_errors=True)
    if left:
        raise ClusterError("the real node left these behind:\n  " + "\n  ".join(sorted(set(left))))
    return stopped


def _api(state: Path) -> Api | None:
    ports = _load_ports(state)
    p = pki.Pki(state / "pki")
    if ports is None or not p.complete():
        return None
    return Api(f"https://{_host(state)}:{ports['apiserver']}", p, timeout_s=5.0)


def status(root: Path | None = None) -> dict[str, int | None]:
    """Each component's pid, or None where it is not running."""
    state = state_dir(root)
    return {name: procs.running(state, name, name) for name in ORDER}


def current(root: Path | None = None) -> Cluster | None:
    """The cluster if every component is running and the API server is ready; starts nothing."""
    state = state_dir(root)
    ports = _load_ports(state)
    p = pki.Pki(state / "pki")
    if ports is None or not p.complete() or not all(status(root).values()):
        return None
    host = _host(state)
    server = f"https://{host}:{ports['apiserver']}"
    api = Api(server, p, timeout_s=3.0)
    if not api.ok("/readyz"):
        return None
    real = host != "127.0.0.1"
    if real and not node.node_ready(api):
        return None
    bins = build.bin_dir()
    return Cluster(state, state / "kubeconfig", bins / "kubectl", server, bins,
                   tuple(n["metadata"]["name"] for n in kwok.nodes(real)),
                   node.NODE_NAME if real else None)
