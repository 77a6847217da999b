"""The allow-lists: which ServiceAccount and which Secrets a resource's pod may name. The operator
creates pods with its own rights, so without them anyone allowed to create an InferenceService
could run a pod as any ServiceAccount of the namespace, or read any of its Secrets into one.

A pod may use the namespace's `default` ServiceAccount (what it gets without naming one) and the
Secrets of the resource's own fields (`spec.model.hfTokenSecret`, `spec.apiKeySecretRef`); any
other name must be in the operator's lists (chart values `security.allowedServiceAccounts` and
`security.allowedSecrets`; `*` allows any). Pure: run over the pod the builders would produce."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from radixserve_operator.podsecurity import CONTAINER_LISTS, Violation
from radixserve_operator.settings import OperatorSettings
from radixserve_operator.spec import ServiceSpec, SpecError
from radixserve_operator.status import REFERENCE_NOT_ALLOWED

ANY = "*"
DEFAULT_SERVICE_ACCOUNT = "default"


class ReferenceNotAllowed(SpecError):
    """The pod would name a ServiceAccount or Secret outside the operator's allow-lists."""

    reason = REFERENCE_NOT_ALLOWED


def own_secrets(spec: ServiceSpec) -> set[str]:
    """The Secrets the resource names in its dedicated fields."""
    refs = (spec.model.hf_token_secret, spec.api_key_secret)
    return {ref[0] for ref in refs if ref}


def _volume_secrets(source: Any, at: str) -> Iterator[tuple[str, str]]:
    """(path, name) of every Secret a volume source names: `secretName` (secret, azureFile), a
    `secretRef`/`*SecretRef` object (csi, cephfs, rbd, iscsi, flexVolume...), and the secret
    sources of a projected volume."""
    if isinstance(source, dict):
        for key, value in source.items():
            path = f"{at}.{key}"
            if key == "secretName" and isinstance(value, str):
                yield path, value
            elif key.lower().endswith("secretref") and isinstance(value, dict):
                yield f"{path}.name", str(value.get("name", ""))
            elif key == "secret" and isinstance(value, dict) and "name" in value:
                yield f"{path}.name", str(value["name"])  # a projected volume's secret source
            else:
                yield from _volume_secrets(value, path)
    elif isinstance(source, list):
        for i, item in enumerate(source):
            yield from _volume_secrets(item, f"{at}[{i}]")


def secret_references(pod: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, Secret name) of every Secret a pod spec reads: env `secretKeyRef`, `envFrom`
    `secretRef`, and volumes. NOTE: imagePullSecrets are not counted: the kubelet uses them to
    pull, no container can read them."""
    out: list[tuple[str, str]] = []
    for field in CONTAINER_LISTS:
        for i, c in enumerate(pod.get(field) or ()):
            at = f"spec.{field}[{i}]"
            for j, e in enumerate(c.get("env") or ()):
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref is not None:
                    out.append((f"{at}.env[{j}].valueFrom.secretKeyRef.name", ref.get("name", "")))
            for j, e in enumerate(c.get("envFrom") or ()):
                if e.get("secretRef") is not None:
                    out.append((f"{at}.envFrom[{j}].secretRef.name", e["secretRef"].get("name", "")))
    for i, v in enumerate(pod.get("volumes") or ()):
        out += _volume_secrets({k: s for k, s in v.items() if k != "name"}, f"spec.volumes[{i}]")
    return out


def reference_violations(
    pod: dict[str, Any], spec: ServiceSpec, settings: OperatorSettings
) -> list[Violation]:
    out: list[Violation] = []
    accounts = {DEFAULT_SERVICE_ACCOUNT, *settings.allowed_service_accounts}
    for key in ("serviceAccountName", "serviceAccount"):
        name = pod.get(key)
        if name and name not in accounts and ANY not in accounts:
            out.append(
                Violation(
                    f"spec.{key}",
                    f"ServiceAccount {name!r} is not in the operator's allow-list "
                    "(chart value security.allowedServiceAccounts)",
                )
            )
    secrets = own_secrets(spec) | set(settings.allowed_secrets)
    if ANY not in secrets:
        for path, name in secret_references(pod):
            if name not in secrets:
                out.append(
                    Violation(
                        path,
                        f"Secret {name!r} is neither the resource's own (spec.model.hfTokenSecret, "
                        "spec.apiKeySecretRef) nor in the operator's allow-list (chart value "
                        "security.allowedSecrets)",
                    )
                )
    return out


def check_references(pod: dict[str, Any], spec: ServiceSpec, settings: OperatorSettings) -> None:
    """Raise `ReferenceNotAllowed` naming every field of the pod spec outside the allow-lists."""
    found = reference_violations(pod, spec, settings)
    if found:
        raise ReferenceNotAllowed("; ".join(map(str, found)))
