"""The operator's own settings, one typed record read from its environment (the chart sets them;
`radixserve-operator` flags set the same variables): what a resource gets when it says nothing."""

from __future__ import annotations

import os
from dataclasses import dataclass

from radixserve_operator import DEFAULT_CPU_IMAGE, DEFAULT_IMAGE

ENV_IMAGE = "RADIXSERVE_DEFAULT_IMAGE"
ENV_CPU_IMAGE = "RADIXSERVE_DEFAULT_CPU_IMAGE"
ENV_PROMETHEUS_URL = "RADIXSERVE_PROMETHEUS_URL"
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"


@dataclass(frozen=True)
class OperatorSettings:
    image: str = DEFAULT_IMAGE  # the runtime image of a GPU replica without spec.image
    cpu_image: str = DEFAULT_CPU_IMAGE  # ... of a CPU replica
    prometheus_url: str = DEFAULT_PROMETHEUS_URL  # KEDA's Prometheus, unless the resource says

    @classmethod
    def from_env(cls) -> OperatorSettings:
        env = os.environ
        return cls(
            image=env.get(ENV_IMAGE) or DEFAULT_IMAGE,
            cpu_image=env.get(ENV_CPU_IMAGE) or DEFAULT_CPU_IMAGE,
            prometheus_url=env.get(ENV_PROMETHEUS_URL) or DEFAULT_PROMETHEUS_URL,
        )
