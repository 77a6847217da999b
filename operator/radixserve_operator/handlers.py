"""kopf handlers: one small function per event, each handing over to `reconcile`. They are plain
functions of kopf's keyword arguments, so tests call them directly with a fake client in `memo`.

No deletion handler and no kopf timer (so no finalizer): the workload and Service carry owner
references and the garbage collector removes them with the resource. The children's watches are
filtered by the API server (a label selector), so the operator never streams the cluster's other
pods; a thread (`resync.py`) re-applies and re-reads every handled resource now and then,
whatever events were missed."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from radixserve_operator import FIELD_MANAGER, GROUP, LABEL_MANAGED_BY, PLURAL, VERSION
from radixserve_operator.modelconfig import fetch_config
from radixserve_operator.reconcile import (
    RETRY_DELAY_S,
    Refused,
    RetryLater,
    reconcile,
    refresh_owner,
)
from radixserve_operator.resync import Resync

log = logging.getLogger(__name__)

RESYNC_S = 30.0
OURS = {LABEL_MANAGED_BY: FIELD_MANAGER}
CHILDREN = (
    ("apps", "v1", "deployments"),
    ("apps", "v1", "statefulsets"),
    ("", "v1", "pods"),
    ("", "v1", "services"),
)


def _reconcile(body: Any, memo: Any, announce: tuple[str, str] | None) -> None:
    meta = body["metadata"]
    memo.setdefault("seen", set()).add((meta["namespace"], meta["name"]))
    try:
        reconcile(memo.client, body, memo.get("fetch_config", fetch_config), announce)
    except RetryLater as e:
        raise kopf.TemporaryError(str(e), delay=RETRY_DELAY_S) from None
    except Refused as e:  # status and event written; kopf must not retry it
        raise kopf.PermanentError(f"{e.reason}: {e}") from None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and the last-handled spec in annotations: the CRD's status schema has no room
    # for kopf's own fields (they would be pruned).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # our own events say what matters
    for group, version, plural in CHILDREN:
        settings.watching.label_selectors[group, version, plural] = f"{LABEL_MANAGED_BY}={FIELD_MANAGER}"
    # Shared by every resource's memo (kopf gives each a shallow copy of this one).
    memo.setdefault("seen", set())
    if "client" not in memo:
        from radixserve_operator.client import KubeClient

        memo.client = KubeClient()
    if "resync" not in memo:
        memo.resync = Resync(memo.client, memo.seen, lambda body: _resync_quietly(body, memo),
                             RESYNC_S)
        memo.resync.start()


@kopf.on.cleanup()
def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    if "resync" in memo:
        memo.resync.stop()


@kopf.on.create(GROUP, VERSION, PLURAL)
def on_create(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconcile(body, memo, ("Created", "created Deployment and Service"))


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def on_update(body: kopf.Body, memo: kopf.Memo, diff: Any = (), **_: Any) -> None:
    fields = sorted({".".join(("spec",) + tuple(str(p) for p in d[1])) for d in diff or ()})
    _reconcile(body, memo, ("Updated", "rolling out " + (", ".join(fields) or "spec")))


@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_resume(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconcile(body, memo, None)


def resync(body: kopf.Body | dict[str, Any], memo: kopf.Memo, **_: Any) -> None:
    """Level-based repair: re-apply the children (a hand edit is undone) and re-read the status. A
    refused generation stays refused: its status and event say why."""
    try:
        _reconcile(body, memo, None)
    except kopf.PermanentError:
        pass


def _resync_quietly(body: dict[str, Any], memo: kopf.Memo) -> None:
    try:
        resync(body=body, memo=memo)
    except kopf.TemporaryError as e:  # the status says why; the next pass tries again
        log.info("%s/%s: %s", body["metadata"]["namespace"], body["metadata"]["name"], e)


@kopf.on.event("apps", "v1", "deployments", labels=OURS)
def on_deployment_event(
    body: kopf.Body, memo: kopf.Memo, type: str | None = None, **_: Any
) -> None:
    refresh_owner(memo.client, body, deleted=type == "DELETED")


@kopf.on.event("apps", "v1", "statefulsets", labels=OURS)
def on_statefulset_event(
    body: kopf.Body, memo: kopf.Memo, type: str | None = None, **_: Any
) -> None:
    refresh_owner(memo.client, body, deleted=type == "DELETED")


@kopf.on.event("", "v1", "services", labels=OURS)
def on_service_event(body: kopf.Body, memo: kopf.Memo, type: str | None = None, **_: Any) -> None:
    if type == "DELETED":
        refresh_owner(memo.client, body, deleted=True)


@kopf.on.event("", "v1", "pods", labels=OURS)
def on_pod_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    refresh_owner(memo.client, body)
