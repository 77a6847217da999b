"""`radixserve-operator`: run the kopf operator.

    radixserve-operator [--namespace NS ...] [--all-namespaces] [--liveness-port 8080]
                        [--peering NAME] [--priority N] [--default-image IMAGE]
                        [--default-cpu-image IMAGE] [--prometheus-url URL]
                        [--pod-security-level baseline|restricted]
                        [--allowed-service-accounts A,B] [--allowed-secrets A,B]
                        [--allowed-registries PREFIX,...]
                        [--network-policy true|false] [--monitoring-namespace NS] [--verbose]

Two replicas: give both the same `--peering NAME` (a KopfPeering object of that name must exist)
and distinct priorities; the replica with the highest priority works, the other stands by."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import zlib

from radixserve_operator import settings


def default_priority() -> int:
    """A priority that differs between replicas of one Deployment (their pod names differ)."""
    env = os.environ.get("RADIXSERVE_OPERATOR_PRIORITY")
    if env:
        return int(env)
    return 100 + zlib.crc32(socket.gethostname().encode()) % 900_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="radixserve-operator", description="The radixserve InferenceService operator."
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch this namespace (repeatable; a glob is allowed)",
    )
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch the whole cluster (the default)"
    )
    p.add_argument(
        "--liveness-port", type=int, default=8080, help="serve http://0.0.0.0:PORT/healthz (0: off)"
    )
    p.add_argument(
        "--peering",
        default=None,
        help="kopf peering object name; omit to run standalone (one replica)",
    )
    p.add_argument(
        "--priority", type=int, default=None, help="peering priority (default: from the pod name)"
    )
    p.add_argument(
        "--default-image",
        default=None,
        help=f"runtime image of a GPU replica without spec.image (env {settings.ENV_IMAGE})",
    )
    p.add_argument(
        "--default-cpu-image",
        default=None,
        help=f"runtime image of a CPU replica without spec.image (env {settings.ENV_CPU_IMAGE})",
    )
    p.add_argument(
        "--prometheus-url",
        default=None,
        help=f"Prometheus for KEDA ScaledObjects (env {settings.ENV_PROMETHEUS_URL})",
    )
    p.add_argument(
        "--pod-security-level",
        choices=settings.POD_SECURITY_LEVELS,
        default=None,
        help=f"Pod Security Standard every pod must meet (default baseline; env "
        f"{settings.ENV_POD_SECURITY_LEVEL})",
    )
    p.add_argument(
        "--allowed-service-accounts",
        default=None,
        help="comma-separated ServiceAccounts a resource may name besides default; * for any "
        f"(env {settings.ENV_ALLOWED_SERVICE_ACCOUNTS})",
    )
    p.add_argument(
        "--allowed-secrets",
        default=None,
        help="comma-separated Secrets a resource's pods may read besides its own fields' "
        f"(env {settings.ENV_ALLOWED_SECRETS})",
    )
    p.add_argument(
        "--allowed-registries",
        default=None,
        help="comma-separated image prefixes (registry/org) a resource's spec.image and "
        f"router.image must start with; none: any image (env {settings.ENV_ALLOWED_REGISTRIES})",
    )
    p.add_argument(
        "--network-policy",
        choices=("true", "false"),
        default=None,
        help=f"a NetworkPolicy per InferenceService (default true; env {settings.ENV_NETWORK_POLICY})",
    )
    p.add_argument(
        "--monitoring-namespace",
        default=None,
        help="namespace whose pods may scrape the servers ('' for none; default monitoring; env "
        f"{settings.ENV_MONITORING_NAMESPACE})",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    args = p.parse_args(argv)
    if args.priority is None:
        args.priority = default_priority()
    return args


def export_settings(args: argparse.Namespace) -> None:
    """Flags win over the environment; `OperatorSettings.from_env` reads the result."""
    for value, name in (
        (args.default_image, settings.ENV_IMAGE),
        (args.default_cpu_image, settings.ENV_CPU_IMAGE),
        (args.prometheus_url, settings.ENV_PROMETHEUS_URL),
        (args.pod_security_level, settings.ENV_POD_SECURITY_LEVEL),
        (args.allowed_service_accounts, settings.ENV_ALLOWED_SERVICE_ACCOUNTS),
        (args.allowed_secrets, settings.ENV_ALLOWED_SECRETS),
        (args.allowed_registries, settings.ENV_ALLOWED_REGISTRIES),
        (args.network_policy, settings.ENV_NETWORK_POLICY),
        (args.monitoring_namespace, settings.ENV_MONITORING_NAMESPACE),
    ):
        if value is not None:
            os.environ[name] = value


def kopf_options(args: argparse.Namespace) -> dict[str, object]:
    opts: dict[str, object] = {
        "standalone": args.peering is None,
        "priority": args.priority,
        "peering_name": args.peering,
        "liveness_endpoint": f"http://0.0.0.0:{args.liveness_port}/healthz"
        if args.liveness_port
        else None,
    }
    if args.namespace:
        opts["namespaces"] = list(args.namespace)
    else:
        opts["clusterwide"] = True
    return opts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    export_settings(args)
    try:
        settings.OperatorSettings.from_env()  # a bad setting fails here, not on every resource
    except ValueError as e:
        print(f"radixserve-operator: {e}", file=sys.stderr)
        return 2
    import kopf

    import radixserve_operator.handlers  # noqa: F401 -- registers the kopf handlers

    kopf.configure(verbose=args.verbose)
    kopf.run(**kopf_options(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
