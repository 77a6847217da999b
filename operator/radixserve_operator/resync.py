"""Level-based repair without a finalizer: a thread that, every `interval` seconds, reconciles each
InferenceService this operator's handlers have taken on, whatever events were missed (a hand
edit of a child is undone, a status is re-read, a retry that kopf gave up on is tried again).

kopf's own timers would do this, but kopf puts its finalizer on every resource that has one, and
only a running kopf takes it off: after `helm uninstall` (operator and its RBAC deleted together)
the resources and their namespaces would stay Terminating. The loop only visits resources that a
kopf handler of this process handled, so a standby peer (kopf peering pauses its handlers) stays
idle, and the per-resource lock in `reconcile` serialises it with the handlers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from radixserve_operator import API_VERSION, KIND
from radixserve_operator.client import ClusterClient

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)


class Resync:
    """Calls `reconcile_one(body)` for every key in `seen` once per `interval` seconds. A key whose
    resource is gone or being deleted is dropped; an error is logged and tried again next pass."""

    def __init__(self, client: ClusterClient, seen: set[Key],
                 reconcile_one: Callable[[dict[str, Any]], None], interval: float) -> None:
        self.client, self.seen, self.reconcile_one, self.interval = client, seen, reconcile_one, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radixserve-resync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def run_once(self) -> None:
        for key in sorted(self.seen):
            if self._stop.is_set():
                return
            namespace, name = key
            try:
                body = self.client.get(API_VERSION, KIND, namespace, name)
                if body is None or body["metadata"].get("deletionTimestamp"):
                    self.seen.discard(key)
                    continue
                self.reconcile_one(body)
            except Exception:  # one resource's failure must not end the loop
                log.exception("%s/%s: resync failed; trying again in %.0fs", namespace, name,
                              self.interval)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.run_once()
