"""The small cluster interface the handlers use, and its implementation over `kubernetes`.
Tests drive the handlers with a fake of `ClusterClient`; nothing else touches the API server."""

from __future__ import annotations

import time
from typing import Any, Protocol

from radixserve_operator import API_VERSION, FIELD_MANAGER, PLURAL

MISSING_API_TTL_S = 60.0


class ApplyRejected(ValueError):
    """The API server refused an object as invalid (HTTP 400/422): the spec must change."""


class APIUnavailable(LookupError):
    """The cluster does not serve this kind (its CRD is not installed, e.g. KEDA's)."""


class StatusConflict(RuntimeError):
    """The resource changed since it was read (HTTP 409): read it again and recompute."""


class ClusterClient(Protocol):
    def apply(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Create or update `obj` (server-side apply, this operator as field manager); idempotent.
        Raises `ApplyRejected` when the API server refuses the object as invalid and
        `APIUnavailable` when the cluster does not serve its kind. `dry_run`: validated and
        admitted by the API server, nothing stored."""

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it (or its kind) does not exist."""

    def delete(
        self, api_version: str, kind: str, namespace: str, name: str, orphan: bool = False
    ) -> None:
        """Delete the object; nothing when it is already gone. `orphan`: leave its dependents
        (a StatefulSet's pods and PVCs) for the next owner to adopt."""

    def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        """Pods in `namespace` whose labels match `selector`."""

    def count_gpu_nodes(self, resource_name: str) -> int | None:
        """Nodes advertising `resource_name` as allocatable; None when not allowed to look."""

    def patch_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> None:
        """Merge `status` into the InferenceService's status subresource. With
        `resource_version`, only if the resource is still at that version, else `StatusConflict`."""

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post a Kubernetes Event (type Normal or Warning) about `obj`."""


class KubeClient:
    """`ClusterClient` over the official client (in-cluster config, else kubeconfig)."""

    def __init__(self) -> None:
        from kubernetes import client, config, dynamic

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self._api = client.ApiClient()
        self._dynamic = dynamic.DynamicClient(self._api)
        self._core = client.CoreV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self._missing: dict[tuple[str, str], float] = {}

    def _resource(self, api_version: str, kind: str) -> Any:
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        # NOTE: a miss makes the dynamic client re-read all of discovery; remember it a while.
        missed = self._missing.get((api_version, kind))
        if missed is not None and time.monotonic() - missed < MISSING_API_TTL_S:
            raise APIUnavailable(f"{api_version} {kind} is not served by this cluster")
        try:
            return self._dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            self._missing[(api_version, kind)] = time.monotonic()
            raise APIUnavailable(f"{api_version} {kind} is not served by this cluster") from None

    def apply(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        from kubernetes.dynamic.exceptions import BadRequestError, UnprocessibleEntityError

        meta = obj["metadata"]
        res = self._resource(obj["apiVersion"], obj["kind"])
        try:
            out = self._dynamic.server_side_apply(
                res,
                body=obj,
                name=meta["name"],
                namespace=meta.get("namespace"),
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
                **({"dry_run": "All"} if dry_run else {}),
            )
        except (BadRequestError, UnprocessibleEntityError) as e:
            raise ApplyRejected(f"{obj['kind']} {meta['name']} rejected: {e.summary()}") from None
        return out.to_dict()

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            return self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except (NotFoundError, APIUnavailable):
            return None

    def delete(
        self, api_version: str, kind: str, namespace: str, name: str, orphan: bool = False
    ) -> None:
        from kubernetes.dynamic.exceptions import NotFoundError

        body = {"propagationPolicy": "Orphan"} if orphan else None
        try:
            self._resource(api_version, kind).delete(name=name, namespace=namespace, body=body)
        except (NotFoundError, APIUnavailable):
            pass

    def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        sel = ",".join(f"{k}={v}" for k, v in selector.items())
        pods = self._resource("v1", "Pod").get(namespace=namespace, label_selector=sel)
        return [p.to_dict() for p in pods.items]

    def count_gpu_nodes(self, resource_name: str) -> int | None:
        from kubernetes.client.exceptions import ApiException

        try:
            nodes = self._core.list_node().items
        except ApiException as e:
            if e.status == 403:
                return None
            raise
        return sum(
            1
            for n in nodes
            if str((n.status.allocatable or {}).get(resource_name, "0")) not in ("0", "")
        )

    def patch_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> None:
        from kubernetes.client.exceptions import ApiException

        group, version = API_VERSION.split("/")
        body: dict[str, Any] = {"status": status}
        if resource_version:  # a precondition: the API server answers 409 if it moved on
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            self._custom.patch_namespaced_custom_object_status(
                group,
                version,
                namespace,
                PLURAL,
                name,
                body,
                _content_type="application/merge-patch+json",
            )
        except ApiException as e:
            if e.status == 409:
                raise StatusConflict(f"{namespace}/{name} changed since it was read") from None
            raise

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        import kopf

        kopf.event(obj, type=type_, reason=reason, message=message[:1024])
