"""A Hugging Face hub on loopback, serving model repos from local directories: the HTTP calls
`huggingface_hub.snapshot_download` makes (repo info at a revision, the recursive tree listing,
HEAD and GET of `resolve/<commit>/<file>`), answered as the hub answers them, and recorded — so a
test can download for real, count what was fetched, check the token sent, and then take the hub
away to prove that what follows needs no network. Also a program: `python fake_hub.py REPO_ID DIR
[REPO_ID DIR ...] PORT` serves those repos on every address (the real-pod suite runs it in a
pod)."""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class Request:
    method: str
    path: str
    authorization: str | None


@dataclass
class FakeHub:
    """`repos`: repo id -> local directory; `gated`: repo ids that need `token`."""

    repos: dict[str, Path]
    token: str | None = None
    gated: set[str] = field(default_factory=set)
    host: str = "127.0.0.1"
    port: int = 0
    log_requests: bool = False  # print each request's method and path (the program's log)
    requests: list[Request] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @staticmethod
    def commit(repo_dir: Path) -> str:
        """A commit id (40 hex digits) that changes with the files."""
        h = hashlib.sha1()
        for f in sorted(repo_dir.rglob("*")):
            if f.is_file():
                h.update(f.relative_to(repo_dir).as_posix().encode() + f.read_bytes())
        return h.hexdigest()

    def downloads(self) -> list[str]:
        """The file contents served (GET of resolve/…), as repo paths."""
        return [
            r.path.split("/resolve/", 1)[1]
            for r in self.requests
            if r.method == "GET" and "/resolve/" in r.path
        ]

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def do_GET(self) -> None:
                hub._handle(self, body=True)

            def do_HEAD(self) -> None:
                hub._handle(self, body=False)

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- the hub's answers
    def _handle(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append(Request(h.command, path, h.headers.get("Authorization")))
        if self.log_requests:
            print(h.command, path, flush=True)
        if path.startswith("/api/models/"):
            repo_id, kind, rest = self._split(
                path.removeprefix("/api/models/"), ("/revision/", "/tree/")
            )
        else:
            repo_id, kind, rest = self._split(path.lstrip("/"), ("/resolve/",))
        if repo_id not in self.repos:
            return self._send(
                h, 404, {"error": "Repository not found"}, body, {"X-Error-Code": "RepoNotFound"}
            )
        if repo_id in self.gated and h.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(
                h,
                401 if not h.headers.get("Authorization") else 403,
                {"error": f"Access to model {repo_id} is restricted."},
                body,
                {"X-Error-Code": "GatedRepo"},
            )
        root, commit = self.repos[repo_id], self.commit(self.repos[repo_id])
        revision, _, file = rest.partition("/")
        if revision not in ("main", commit):
            return self._send(
                h,
                404,
                {"error": f"Invalid rev id: {revision}"},
                body,
                {"X-Error-Code": "RevisionNotFound"},
            )
        if kind == "/revision/":
            files = [
                {"rfilename": f.relative_to(root).as_posix()}
                for f in sorted(root.rglob("*"))
                if f.is_file()
            ]
            return self._send(
                h,
                200,
                {
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": commit,
                    "siblings": files,
                    "private": False,
                    "gated": repo_id in self.gated,
                },
                body,
            )
        if kind == "/tree/":
            tree = [
                {
                    "type": "file",
                    "path": f.relative_to(root).as_posix(),
                    "size": f.stat().st_size,
                    "oid": hashlib.sha1(f.read_bytes()).hexdigest(),
                }
                for f in sorted(root.rglob("*"))
                if f.is_file()
            ]
            return self._send(h, 200, tree, body)
        target = root / file
        if not target.is_file():
            return self._send(
                h, 404, {"error": "Entry not found"}, body, {"X-Error-Code": "EntryNotFound"}
            )
        data = target.read_bytes()
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        h.send_header("X-Repo-Commit", commit)
        h.end_headers()
        if body:
            h.wfile.write(data)

    @staticmethod
    def _split(path: str, kinds: tuple[str, ...]) -> tuple[str, str, str]:
        for kind in kinds:
            if kind in path:
                repo_id, _, rest = path.partition(kind)
                return repo_id, kind, rest
        return path, "", ""

    @staticmethod
    def _send(
        h: BaseHTTPRequestHandler,
        status: int,
        payload: object,
        body: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(data)


def main(argv: list[str]) -> None:
    """`REPO_ID DIR [REPO_ID DIR ...] PORT`."""
    *pairs, port = argv
    repos = {repo_id: Path(directory) for repo_id, directory in zip(pairs[::2], pairs[1::2])}
    hub = FakeHub(repos, host="0.0.0.0", port=int(port), log_requests=True).start()
    for repo_id, directory in repos.items():
        print(f"serving {repo_id} from {directory} on port {port}", flush=True)
    threading.Event().wait()  # until the process is stopped
    hub.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
