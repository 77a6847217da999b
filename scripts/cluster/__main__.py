"""``python -m scripts.cluster {build,up,down,status,env}`` — the local control plane's CLI."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# NOTE: controlplane (and its `cryptography`) is imported only where needed: `build` runs before
# the project's dependencies are installed (`make test` overlaps the two).
from . import build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.cluster",
        description="A local Kubernetes control plane on loopback (etcd, kube-apiserver, "
        "kube-controller-manager, kube-scheduler) with KWOK fake GPU nodes.",
    )
    parser.add_argument("--root", type=Path, default=None,
                        help="repo root; state goes to ROOT/.cluster unless "
                        "RADIXSERVE_CLUSTER_DIR is set (default: this checkout)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build and cache the binaries (no-op when cached)")
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    sub.add_parser("up", help="start whatever is not running, create the fake nodes")
    sub.add_parser("down", help="stop every process and remove the state dir")
    sub.add_parser("status", help="what is running")
    sub.add_parser("env", help="print `export KUBECONFIG=…`")
    sub.add_parser("images", help="build the images and import them into the real node")
    sub.add_parser("deploy", help="the images on the real node, then the chart (operator pod)")
    args = parser.parse_args(argv)

    if args.cmd == "build":
        try:
            print(build.ensure_binaries(force=args.force))
        except build.BuildError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    from . import controlplane

    try:
        if args.cmd == "up":
            cluster = controlplane.up(args.root)
            print(f"kubeconfig: {cluster.kubeconfig}")
            print(f"  export KUBECONFIG={cluster.kubeconfig}")
            print(f"  kubectl:  {cluster.kubectl}")
        elif args.cmd == "down":
            state = controlplane.state_dir(args.root)
            existed = state.exists()
            stopped = controlplane.down(args.root)
            gone = "removed" if existed and not state.exists() else "absent" if not existed else "kept"
            print(f"[cluster] down ({len(stopped)} processes stopped, {state} {gone})")
        elif args.cmd == "status":
            return _status(args.root)
        elif args.cmd == "env":
            print(f"export KUBECONFIG={controlplane.state_dir(args.root) / 'kubeconfig'}")
        elif args.cmd in ("images", "deploy"):
            return _deploy(args.root, chart=args.cmd == "deploy")
    except (controlplane.ClusterError, build.BuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _deploy(root: Path | None, chart: bool) -> int:
    from . import controlplane, deploy

    cluster = controlplane.current(root)
    if cluster is None or cluster.real_node is None:
        print("error: no cluster with the real node runs here: `make cluster` first "
              "(as root on Debian)", file=sys.stderr)
        return 1
    deploy.load_images(cluster.state_dir)
    if chart:
        deploy.install_chart(cluster.kubeconfig)
        print(f"[deploy] the operator runs in {deploy.OPERATOR_NS}; try: kubectl apply -f "
              "manifests/samples/inferenceservice-cpu.yaml")
    return 0


def _status(root: Path | None) -> int:
    from . import controlplane

    state = controlplane.state_dir(root)
    pids = controlplane.status(root)
    for name, pid in pids.items():
        print(f"{name:24} {'running, pid ' + str(pid) if pid else 'not running'}")
    cluster = controlplane.current(root)
    if cluster:
        print(f"API server {cluster.server} ready; kubeconfig {cluster.kubeconfig}")
    else:
        print(f"not ready (state dir {state}{'' if state.exists() else ', absent'})")
    print(f"binaries: {build.bin_dir()} ({'built' if build.is_built() else 'not built'})")
    return 0 if cluster else 3


if __name__ == "__main__":
    sys.exit(main())
