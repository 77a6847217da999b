"""Whose the objects an InferenceService would write already are, before any is written.

Two resources can derive the same object name (`foo` with a router owns `foo-router`; so would an
InferenceService named `foo-router`), and a user may already have a Service of that name. Server-
side apply would silently take such an object over (its owner references, its selector), so the
reconciler writes nothing while any object it would write exists and is controlled by something
else. The previous incarnation of the same resource (deleted, re-created under the same name, its
children not yet collected) is no one else: its children are taken over, as before."""

from __future__ import annotations

from typing import Any

from radixserve_operator import KIND
from radixserve_operator.client import ClusterClient
from radixserve_operator.status import NAME_CONFLICT

__all__ = ["NAME_CONFLICT", "conflict", "conflicts"]


def _controller(obj: dict[str, Any]) -> dict[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return next((r for r in refs if r.get("controller")), None)


def conflict(live: dict[str, Any] | None, owner: dict[str, Any]) -> str | None:
    """Why `live` (the existing object of a name the owner would write) is not the owner's to
    write; None when it is absent, the owner's, or a former incarnation's of the same name."""
    if live is None:
        return None
    meta, ref = owner["metadata"], _controller(live)
    if ref is not None and ref.get("uid") == meta.get("uid"):
        return None
    if ref is not None and ref.get("kind") == KIND and ref.get("name") == meta["name"]:
        return None
    what = f"{live.get('kind')} {live['metadata']['name']}"
    if ref is None:
        return f"{what} exists and was not created by this InferenceService"
    return f"{what} belongs to {ref.get('kind')} {ref.get('name')}"


def conflicts(
    client: ClusterClient, owner: dict[str, Any], objects: list[dict[str, Any]]
) -> list[str]:
    """What each object of `objects` that exists under another controller says (`conflict`)."""
    out = []
    for obj in objects:
        meta = obj["metadata"]
        live = client.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        problem = conflict(live, owner)
        if problem:
            out.append(problem)
    return out
