"""The operator's own settings, one typed record read from its environment (the chart sets them;
`radixserve-operator` flags set the same variables): what a resource gets when it says nothing,
and what it may ask for (the Pod Security level, the allow-lists, the NetworkPolicy)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from radixserve_operator import DEFAULT_CPU_IMAGE, DEFAULT_IMAGE

ENV_IMAGE = "RADIXSERVE_DEFAULT_IMAGE"
ENV_CPU_IMAGE = "RADIXSERVE_DEFAULT_CPU_IMAGE"
ENV_PROMETHEUS_URL = "RADIXSERVE_PROMETHEUS_URL"
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
ENV_POD_SECURITY_LEVEL = "RADIXSERVE_POD_SECURITY_LEVEL"
ENV_ALLOWED_SERVICE_ACCOUNTS = "RADIXSERVE_ALLOWED_SERVICE_ACCOUNTS"
ENV_ALLOWED_SECRETS = "RADIXSERVE_ALLOWED_SECRETS"
ENV_ALLOWED_REGISTRIES = "RADIXSERVE_ALLOWED_REGISTRIES"
ENV_NETWORK_POLICY = "RADIXSERVE_NETWORK_POLICY"
ENV_MONITORING_NAMESPACE = "RADIXSERVE_MONITORING_NAMESPACE"
POD_SECURITY_LEVELS = ("baseline", "restricted")  # the Pod Security Standards a pod may be held to
DEFAULT_MONITORING_NAMESPACE = "monitoring"


def _names(raw: str | None) -> tuple[str, ...]:
    """A comma-separated list of names ("" or unset: none)."""
    return tuple(n.strip() for n in (raw or "").split(",") if n.strip())


def _flag(raw: str | None, default: bool) -> bool:
    if raw is None or not raw.strip():
        return default
    if raw.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if raw.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{ENV_NETWORK_POLICY}: expected true or false, got {raw!r}")


@dataclass(frozen=True)
class OperatorSettings:
    image: str = DEFAULT_IMAGE  # the runtime image of a GPU replica without spec.image
    cpu_image: str = DEFAULT_CPU_IMAGE  # ... of a CPU replica
    prometheus_url: str = DEFAULT_PROMETHEUS_URL  # KEDA's Prometheus, unless the resource says
    # The Pod Security Standard every pod the operator builds must meet (podsecurity.py).
    pod_security_level: str = "baseline"
    # What a resource may name beyond its own dedicated fields (references.py); "*": any.
    allowed_service_accounts: tuple[str, ...] = ()
    allowed_secrets: tuple[str, ...] = ()
    # Image prefixes (registry/org/) a resource's spec.image and router.image must start with;
    # empty: any image (images.py).
    allowed_registries: tuple[str, ...] = ()
    network_policy: bool = True  # a NetworkPolicy per InferenceService (network.py)
    monitoring_namespace: str = DEFAULT_MONITORING_NAMESPACE  # "" : no ingress for scrapers

    def __post_init__(self) -> None:
        if self.pod_security_level not in POD_SECURITY_LEVELS:
            raise ValueError(
                f"pod security level must be one of {', '.join(POD_SECURITY_LEVELS)}, "
                f"got {self.pod_security_level!r}"
            )

    @classmethod
    def from_env(cls) -> OperatorSettings:
        env = os.environ
        return cls(
            image=env.get(ENV_IMAGE) or DEFAULT_IMAGE,
            cpu_image=env.get(ENV_CPU_IMAGE) or DEFAULT_CPU_IMAGE,
            prometheus_url=env.get(ENV_PROMETHEUS_URL) or DEFAULT_PROMETHEUS_URL,
            pod_security_level=(env.get(ENV_POD_SECURITY_LEVEL) or "baseline").strip(),
            allowed_service_accounts=_names(env.get(ENV_ALLOWED_SERVICE_ACCOUNTS)),
            allowed_secrets=_names(env.get(ENV_ALLOWED_SECRETS)),
            allowed_registries=_names(env.get(ENV_ALLOWED_REGISTRIES)),
            network_policy=_flag(env.get(ENV_NETWORK_POLICY), True),
            monitoring_namespace=env.get(ENV_MONITORING_NAMESPACE, DEFAULT_MONITORING_NAMESPACE).strip(),
        )
