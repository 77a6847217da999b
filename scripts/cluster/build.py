"""Build the control-plane binaries from Kubernetes', etcd's and KWOK's Go modules, once, and cache them.

Each group is built in a throwaway wrapper module (``module radixserve.dev/k8sbuild``) that requires
the upstream module at a pinned version, with a ``tools.go`` that blank-imports the ``main``
packages. That sidesteps the ``replace`` directives that make ``go install pkg@version`` fail for
Kubernetes and etcd. The Go module and build caches stay at their defaults, so a rebuild after a
version bump only compiles what changed.

Layout: ``$RADIXSERVE_K8S_CACHE`` (default ``~/.cache/radixserve/k8s``) ``/<k8s version>/bin/``
holds the binaries, one ``.stamp-<group>`` per finished group and ``.stamp`` once all are there;
``src/<group>/`` the wrapper modules and ``logs/build-<group>.log`` the ``go build -v`` output.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import procs

K8S_VERSION = "v1.35.4"
K8S_STAGING_VERSION = "v0.35.4"  # staging modules (k8s.io/api, client-go, …) carry v0.<minor>.<patch>
ETCD_VERSION = "v3.6.16"  # newest v3.6 patch on the module proxy when this was written
KWOK_VERSION = "v0.8.0"
COREDNS_VERSION = "v1.14.7"
PAUSE_VERSION = "3.10"  # the sandbox image's tag; the program is ours (PAUSE_MAIN)

# Every staging module of k8s.io/kubernetes: its go.mod requires them at v0.0.0 and replaces them
# with ./staging/…, which a dependent module does not inherit, so the wrapper replaces them again.
K8S_STAGING = (
    "api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime", "client-go",
    "cloud-provider", "cluster-bootstrap", "code-generator", "component-base", "component-helpers",
    "controller-manager", "cri-api", "cri-client", "csi-translation-lib",
    "dynamic-resource-allocation", "endpointslice", "externaljwt", "kms", "kube-aggregator",
    "kube-controller-manager", "kube-proxy", "kube-scheduler", "kubectl", "kubelet", "metrics",
    "mount-utils", "pod-security-admission", "sample-apiserver", "sample-cli-plugin",
    "sample-controller", "devicemanager",
)

WRAPPER_MODULE = "radixserve.dev/k8sbuild"
HEARTBEAT_S = 30.0


@dataclass(frozen=True)
class Group:
    """One wrapper module and the binaries built from it."""

    name: str
    module: str
    version: str
    packages: dict[str, str]  # binary name -> main package
    replaces: tuple[tuple[str, str], ...] = ()
    ldflags: tuple[str, ...] = ()
    main_go: str = ""  # a main package of the wrapper's own (packages then maps to ".")
    static: bool = False  # CGO off: the binary runs in an image with nothing else in it

    @property
    def stamp(self) -> str:
        digest = hashlib.sha256(self.main_go.encode()).hexdigest()[:12] if self.main_go else ""
        parts = (f"{self.module}@{self.version}", *self.ldflags, digest, "static" * self.static)
        return " ".join(p for p in parts if p) + "\n"


def _k8s_version_flags() -> tuple[str, ...]:
    """What a release build stamps in: without it the API server says v0.0.0-master, and Helm
    (kubeVersion constraints) and kubectl's version skew checks refuse it."""
    major, minor = K8S_VERSION.lstrip("v").split(".")[:2]
    fields = {"gitVersion": K8S_VERSION, "gitMajor": major, "gitMinor": minor,
              "gitTreeState": "clean"}  # fmt: skip
    return tuple(
        f"-X {pkg}.{key}={value}"
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for key, value in fields.items()
    )


GROUPS: tuple[Group, ...] = (
    Group(
        name="kubernetes",
        module="k8s.io/kubernetes",
        version=K8S_VERSION,
        packages={
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
            "kubelet": "k8s.io/kubernetes/cmd/kubelet",
            "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
        },
        replaces=tuple((f"k8s.io/{m}", f"k8s.io/{m}@{K8S_STAGING_VERSION}") for m in K8S_STAGING),
        ldflags=_k8s_version_flags(),
    ),
    Group(
        name="etcd",
        module="go.etcd.io/etcd/server/v3",
        version=ETCD_VERSION,
        packages={"etcd": "go.etcd.io/etcd/server/v3"},  # the module root is etcd's main package
    ),
    Group(
        name="kwok",
        module="sigs.k8s.io/kwok",
        version=KWOK_VERSION,
        packages={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
    ),
)

# CoreDNS with only what a node's cluster DNS needs: no `forward`, so a name outside the cluster
# is refused here instead of being sent to the machine's resolver.
COREDNS_PLUGINS = ("errors", "bind", "health", "ready", "kubernetes", "cache")
COREDNS_MAIN = f"""package main

import (
\t"github.com/coredns/coredns/core/dnsserver"
\t"github.com/coredns/coredns/coremain"
{chr(10).join(f'{chr(9)}_ "github.com/coredns/coredns/plugin/{p}"' for p in COREDNS_PLUGINS)}
)

func init() {{
\tdnsserver.Directives = []string{{{", ".join(f'"{p}"' for p in COREDNS_PLUGINS)}}}
}}

func main() {{ coremain.Run() }}
"""

# The sandbox ("pause") container: holds the pod's namespaces, reaps orphans, exits on a signal.
PAUSE_MAIN = """package main

import (
\t"os"
\t"os/signal"
\t"syscall"
)

func main() {
\tsigs := make(chan os.Signal, 8)
\tsignal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
\tfor sig := range sigs {
\t\tif sig != syscall.SIGCHLD {
\t\t\tos.Exit(0)
\t\t}
\t\tfor {
\t\t\tvar status syscall.WaitStatus
\t\t\tif pid, _ := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 {
\t\t\t\tbreak
\t\t\t}
\t\t}
\t}
}
"""

NODE_GROUPS: tuple[Group, ...] = (
    Group(
        name="coredns",
        module="github.com/coredns/coredns",
        version=COREDNS_VERSION,
        packages={"coredns": "."},
        main_go=COREDNS_MAIN,
    ),
    Group(name="pause", module="", version=PAUSE_VERSION, packages={"pause": "."},
          main_go=PAUSE_MAIN, static=True),
)
GROUPS = GROUPS + NODE_GROUPS

BINARIES: tuple[str, ...] = tuple(b for g in GROUPS for b in g.packages)


class BuildError(RuntimeError):
    """A Go step failed; the message names the step and carries the tail of its output."""


def cache_root() -> Path:
    env = os.environ.get("RADIXSERVE_K8S_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "radixserve" / "k8s"


def version_dir() -> Path:
    return cache_root() / K8S_VERSION


def bin_dir() -> Path:
    return version_dir() / "bin"


def _stamp_path(group: Group) -> Path:
    return bin_dir() / f".stamp-{group.name}"


def _all_stamp() -> str:
    return "".join(g.stamp for g in GROUPS)


def _group_built(group: Group) -> bool:
    stamp = _stamp_path(group)
    return (
        stamp.is_file()
        and stamp.read_text() == group.stamp
        and all((bin_dir() / b).is_file() for b in group.packages)
    )


def is_built() -> bool:
    """True when every binary is cached (the ``.stamp`` marks a complete build)."""
    stamp = bin_dir() / ".stamp"
    return stamp.is_file() and stamp.read_text() == _all_stamp() and all(map(_group_built, GROUPS))


def unavailable_reason() -> str | None:
    """Why the binaries can't be had here, or None."""
    if sys.platform != "linux":
        return f"the local control plane runs on Linux only (this is {sys.platform})"
    if is_built():
        return None
    if shutil.which("go") is None:
        return (
            f"go not found on PATH and no cached binaries in {bin_dir()}: install Go >= 1.26 "
            "(https://go.dev/dl/) so `make cluster` can build kube-apiserver, etcd and kwok"
        )
    return None


def _log(msg: str, t0: float) -> None:
    print(f"[cluster build {_fmt(time.monotonic() - t0)}] {msg}", flush=True)


def _fmt(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"


def _go_env(static: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    if static:
        env["CGO_ENABLED"] = "0"
    env["GOFLAGS"] = "-mod=mod"
    env.setdefault("GO111MODULE", "on")
    return env


def _run(args: list[str], cwd: Path, log: Path, what: str, t0: float,
         static: bool = False) -> None:
    """Run a go command, its output to ``log``; a heartbeat line every HEARTBEAT_S seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=_go_env(static), stdout=out, stderr=subprocess.STDOUT)
        next_beat = start + HEARTBEAT_S
        while proc.poll() is None:
            time.sleep(1.0)
            if time.monotonic() >= next_beat:
                next_beat += HEARTBEAT_S
                done = f", {_count_lines(log)} packages compiled" if "-v" in args else ""
                _log(f"  … {what}: {_fmt(time.monotonic() - start)} so far{done}", t0)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise BuildError(f"{what} failed (exit {proc.returncode}); full log: {log}\n{tail}")


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _write_wrapper(group: Group, src: Path) -> None:
    src.mkdir(parents=True, exist_ok=True)
    imports = "\n".join(f'\t_ "{pkg}"' for pkg in group.packages.values())
    if group.main_go:
        (src / "tools.go").unlink(missing_ok=True)
        (src / "main.go").write_text(group.main_go)
    else:
        (src / "tools.go").write_text(
            f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n"
        )
    (src / "go.mod").write_text(f"module {WRAPPER_MODULE}\n\ngo 1.26\n")


def _build_group(group: Group, t0: float) -> None:
    src = version_dir() / "src" / group.name
    logs = version_dir() / "logs"
    _log(f"{group.name}: wrapper module in {src} ({group.module}@{group.version})", t0)
    _write_wrapper(group, src)
    if group.module:
        edit = ["go", "mod", "edit", f"-require={group.module}@{group.version}"]
        edit += [f"-replace={old}={new}" for old, new in group.replaces]
        _run(edit, src, logs / f"mod-edit-{group.name}.log", f"{group.name}: go mod edit", t0)
    _log(f"{group.name}: go mod tidy (downloads modules on a cold module cache)", t0)
    _run(["go", "mod", "tidy"], src, logs / f"mod-tidy-{group.name}.log",
         f"{group.name}: go mod tidy", t0)
    out = version_dir() / "tmp-bin" / group.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    names = ", ".join(group.packages)
    _log(f"{group.name}: go build {names} (many minutes on a cold build cache)", t0)
    # One package: name the binary (etcd's main package path ends in /v3). Several: `-o dir/`
    # names each after its last path element, which is the binary's name for Kubernetes' cmd/*.
    single = len(group.packages) == 1
    target = str(out / next(iter(group.packages))) if single else f"{out}/"
    build = ["go", "build", "-v", "-trimpath", f"-ldflags=-s -w {' '.join(group.ldflags)}".strip(),
             "-o", target]  # fmt: skip
    _run(build + list(group.packages.values()), src, logs / f"build-{group.name}.log",
         f"{group.name}: go build", t0, group.static)
    bin_dir().mkdir(parents=True, exist_ok=True)
    for binary, pkg in group.packages.items():
        built = out / (binary if single else pkg.rsplit("/", 1)[-1])
        if not built.is_file():
            raise BuildError(f"{group.name}: go build did not produce {built}")
        os.replace(built, bin_dir() / binary)
    shutil.rmtree(out, ignore_errors=True)
    _stamp_path(group).write_text(group.stamp)
    _log(f"{group.name}: done", t0)


def ensure_binaries(force: bool = False) -> Path:
    """Build whatever is missing from the cache; returns the directory holding the binaries."""
    if not force and is_built():
        return bin_dir()
    with procs.locked(version_dir() / ".build.lock"):
        if not force and is_built():  # another process built it while we waited
            return bin_dir()
        return _build_all(force)


def _build_all(force: bool) -> Path:
    reason = unavailable_reason()
    if reason:
        raise BuildError(reason)
    t0 = time.monotonic()
    _log(f"building Kubernetes {K8S_VERSION}, etcd {ETCD_VERSION}, kwok {KWOK_VERSION} into "
         f"{bin_dir()}", t0)
    for group in GROUPS:
        if not force and _group_built(group):
            _log(f"{group.name}: cached", t0)
            continue
        _build_group(group, t0)
    (bin_dir() / ".stamp").write_text(_all_stamp())
    shutil.rmtree(version_dir() / "tmp-bin", ignore_errors=True)
    _log(f"all binaries in {bin_dir()}", t0)
    return bin_dir()
