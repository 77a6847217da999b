"""The Kubernetes Pod Security Standards, `baseline` and `restricted`
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), as a check of a pod
template: every field that breaks the level, by its path in the pod (`spec.volumes[2].hostPath`).
Pure: the reconciler runs it over the pod the builders would produce, before anything is created,
so an InferenceService never yields a pod that its author could not create under the cluster's
Pod Security admission at that level.

The chart's ValidatingAdmissionPolicy refuses the same volume types at admission (its lists are
BASELINE_FORBIDDEN_VOLUMES and RESTRICTED_VOLUMES); this check also covers what the builders
themselves write and what only the pod's annotations can ask for (AppArmor)."""

from __future__ import annotations

from typing import Any, NamedTuple

from radixserve_operator.spec import SpecError
from radixserve_operator.status import POD_SECURITY_VIOLATION

BASELINE, RESTRICTED = "baseline", "restricted"
BASELINE_FORBIDDEN_VOLUMES = ("hostPath",)
RESTRICTED_VOLUMES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    }
)  # fmt: skip
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
APPARMOR_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


class Violation(NamedTuple):
    path: str  # in the pod: spec.volumes[2].hostPath
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class PodSecurityError(SpecError):
    """The pod the resource asks for breaks the operator's Pod Security level."""

    reason = POD_SECURITY_VIOLATION


def volume_sources(volume: dict[str, Any]) -> list[str]:
    """Every key of the volume besides `name`, null ones too: a volume has exactly one source,
    and the API server reads a null `emptyDir` beside a `hostPath` as a hostPath volume."""
    return [k for k in volume if k != "name"]


def _volume_shape(i: int, volume: Any) -> list[Violation]:
    at = f"spec.volumes[{i}]"
    if not isinstance(volume, dict):
        return [Violation(at, "a volume is an object with a name and one source")]
    sources = volume_sources(volume)
    name = volume.get("name")
    if len(sources) != 1:
        return [
            Violation(
                at,
                f"volume {name!r} must have exactly one source, got "
                f"{', '.join(sources) or 'none'}",
            )
        ]
    if volume[sources[0]] is None:
        return [Violation(f"{at}.{sources[0]}", f"volume {name!r}: its source is null")]
    return []


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"spec.{field}[{i}]", c)
        for field in CONTAINER_LISTS
        for i, c in enumerate(spec.get(field) or ())
    ]


def _common(ctx: dict[str, Any], at: str) -> list[Violation]:
    """The rules a pod's and a container's securityContext share (baseline)."""
    out: list[Violation] = []
    if (ctx.get("windowsOptions") or {}).get("hostProcess"):
        out.append(
            Violation(f"{at}.windowsOptions.hostProcess", "HostProcess containers are not allowed")
        )
    se = ctx.get("seLinuxOptions") or {}
    if se.get("type", "") not in SELINUX_TYPES:
        out.append(
            Violation(f"{at}.seLinuxOptions.type", f"SELinux type {se['type']!r} is not allowed")
        )
    for key in ("user", "role"):
        if se.get(key):
            out.append(
                Violation(
                    f"{at}.seLinuxOptions.{key}", "custom SELinux users and roles are not allowed"
                )
            )
    if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append(
            Violation(f"{at}.seccompProfile.type", "an Unconfined seccomp profile is not allowed")
        )
    apparmor = (ctx.get("appArmorProfile") or {}).get("type")
    if apparmor is not None and apparmor not in APPARMOR_TYPES:
        out.append(
            Violation(f"{at}.appArmorProfile.type", f"AppArmor profile {apparmor} is not allowed")
        )
    return out


def _baseline(template: dict[str, Any]) -> list[Violation]:
    spec = template.get("spec") or {}
    out: list[Violation] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(Violation(f"spec.{key}", "sharing the host's namespaces is not allowed"))
    pod_ctx = spec.get("securityContext") or {}
    out += _common(pod_ctx, "spec.securityContext")
    for i, s in enumerate(pod_ctx.get("sysctls") or ()):
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(
                Violation(
                    f"spec.securityContext.sysctls[{i}]", f"sysctl {s.get('name')} is not safe"
                )
            )
    for i, v in enumerate(spec.get("volumes") or ()):
        out += _volume_shape(i, v)
        for kind in volume_sources(v) if isinstance(v, dict) else ():
            if kind in BASELINE_FORBIDDEN_VOLUMES:
                out.append(
                    Violation(
                        f"spec.volumes[{i}].{kind}",
                        f"{kind} volumes are not allowed (volume {v.get('name')!r})",
                    )
                )
    for key, value in ((template.get("metadata") or {}).get("annotations") or {}).items():
        if (
            key.startswith(APPARMOR_ANNOTATION)
            and value != "runtime/default"
            and not value.startswith("localhost/")
        ):
            out.append(
                Violation(
                    f"metadata.annotations[{key}]", f"AppArmor profile {value} is not allowed"
                )
            )
    for at, c in _containers(spec):
        ctx = c.get("securityContext") or {}
        out += _common(ctx, f"{at}.securityContext")
        if ctx.get("privileged"):
            out.append(
                Violation(
                    f"{at}.securityContext.privileged", "privileged containers are not allowed"
                )
            )
        if ctx.get("procMount", "Default") != "Default":
            out.append(
                Violation(
                    f"{at}.securityContext.procMount", "only the Default /proc mount is allowed"
                )
            )
        added = [
            a
            for a in (ctx.get("capabilities") or {}).get("add") or ()
            if a not in BASELINE_CAPABILITIES
        ]
        if added:
            out.append(
                Violation(
                    f"{at}.securityContext.capabilities.add",
                    f"capabilities {', '.join(added)} are not allowed",
                )
            )
        for j, port in enumerate(c.get("ports") or ()):
            if port.get("hostPort"):
                out.append(Violation(f"{at}.ports[{j}].hostPort", "host ports are not allowed"))
    return out


def _restricted(template: dict[str, Any]) -> list[Violation]:
    spec = template.get("spec") or {}
    pod_ctx = spec.get("securityContext") or {}
    out: list[Violation] = []
    for i, v in enumerate(spec.get("volumes") or ()):
        for kind in volume_sources(v) if isinstance(v, dict) else ():
            if kind not in RESTRICTED_VOLUMES and kind not in BASELINE_FORBIDDEN_VOLUMES:
                out.append(
                    Violation(
                        f"spec.volumes[{i}].{kind}",
                        f"{kind} volumes are not allowed (volume {v.get('name')!r}); allowed: "
                        + ", ".join(RESTRICTED_VOLUMES),
                    )
                )
    if pod_ctx.get("runAsUser") == 0:
        out.append(
            Violation("spec.securityContext.runAsUser", "running as root (UID 0) is not allowed")
        )
    pod_non_root = pod_ctx.get("runAsNonRoot") is True
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type") in (
        "RuntimeDefault",
        "Localhost",
    )
    for at, c in _containers(spec):
        ctx = c.get("securityContext") or {}
        where = f"{at}.securityContext"
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(Violation(f"{where}.allowPrivilegeEscalation", "must be false"))
        non_root = ctx.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            out.append(
                Violation(f"{where}.runAsNonRoot", "must be true (here or in spec.securityContext)")
            )
        if ctx.get("runAsUser") == 0:
            out.append(Violation(f"{where}.runAsUser", "running as root (UID 0) is not allowed"))
        seccomp = (ctx.get("seccompProfile") or {}).get("type")
        if seccomp is None and not pod_seccomp:
            out.append(
                Violation(
                    f"{where}.seccompProfile.type",
                    "must be RuntimeDefault or Localhost (here or in spec.securityContext)",
                )
            )
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            out.append(Violation(f"{where}.capabilities.drop", "must include ALL"))
        added = [
            a
            for a in caps.get("add") or ()
            if a in BASELINE_CAPABILITIES and a not in RESTRICTED_CAPABILITIES
        ]
        if added:
            out.append(
                Violation(
                    f"{where}.capabilities.add",
                    f"only NET_BIND_SERVICE may be added, not {', '.join(added)}",
                )
            )
    return out


def violations(template: dict[str, Any], level: str) -> list[Violation]:
    """What in a pod template (`{metadata, spec}`) breaks the Pod Security Standard `level`
    (restricted includes baseline)."""
    if level not in (BASELINE, RESTRICTED):
        raise ValueError(f"unknown Pod Security level {level!r}")
    out = _baseline(template)
    if level == RESTRICTED:
        out += _restricted(template)
    return out


def check_pod_template(template: dict[str, Any], level: str) -> None:
    """Raise `PodSecurityError` naming every field of the pod template that breaks `level`."""
    found = violations(template, level)
    if found:
        raise PodSecurityError(
            f"the pod would break the Pod Security Standard {level!r} the operator enforces: "
            + "; ".join(map(str, found))
        )
