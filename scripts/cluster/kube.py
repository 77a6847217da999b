"""A tiny JSON client for the local API server (admin client certificate), and health probes.

Only what ``up`` needs: readiness probes, GET, POST and a strategic-merge PATCH. Tests talk to the
cluster through the kubeconfig with kubectl or the ``kubernetes`` client.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from .pki import Pki

# Loopback only: never route through an HTTP(S)_PROXY from the environment.
_NO_PROXY = urllib.request.ProxyHandler({})


def _open(req: urllib.request.Request, ctx: ssl.SSLContext, timeout_s: float):
    opener = urllib.request.build_opener(_NO_PROXY, urllib.request.HTTPSHandler(context=ctx))
    return opener.open(req, timeout=timeout_s)


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class Api:
    def __init__(self, server: str, pki: Pki, timeout_s: float = 10.0) -> None:
        self.server = server.rstrip("/")
        self.timeout_s = timeout_s
        ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
        ctx.load_cert_chain(str(pki.admin_crt), str(pki.admin_key))
        self._ctx = ctx

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with _open(req, self._ctx, self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str, missing_ok: bool = True) -> Any:
        try:
            return self.request("DELETE", path)
        except ApiError as e:
            if missing_ok and e.status == 404:
                return None
            raise

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, "application/strategic-merge-patch+json")

    def ok(self, path: str) -> bool:
        """GET ``path`` answers 2xx (``/readyz``, ``/livez``)."""
        try:
            self.request("GET", path)
            return True
        except (ApiError, OSError):
            return False


def http_ok(url: str, timeout_s: float = 3.0) -> bool:
    """A plain health probe: 2xx from ``url``; https is not verified (loopback self-signed)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with _open(urllib.request.Request(url), ctx, timeout_s) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError):
        return False
