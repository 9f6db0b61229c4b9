"""A Hugging Face Hub served from this machine: the part of the Hub's HTTP API that the installed
huggingface_hub's `snapshot_download` calls (2.4: `HfApi.repo_info`, `list_repo_tree`, then a
HEAD and a GET per file), served by the standard library's http.server in a thread. Not a mock:
huggingface_hub talks to it over HTTP through HF_ENDPOINT, as it talks to huggingface.co.

- GET /api/models/{repo}/revision/{rev}: the repo's info; `sha` is the commit (repo_info)
- GET /api/models/{repo}/tree/{rev}?recursive=...: its files, `oid` the git blob id and `lfs` the
  sha256 for weights (list_repo_tree, one page: no Link header)
- HEAD and GET /{repo}/resolve/{rev}/{file}: the headers get_hf_file_metadata reads (X-Repo-Commit,
  ETag, Content-Length) and a body that honours `Range: bytes=N-` (206), as http_get resumes
- a missing repo: 401 with `X-Error-Code: RepoNotFound`, as the Hub answers it

Faults a test sets: `drop_once` (file names whose next GET is cut halfway, the connection closed),
`hang` (file names whose GET sends half, then waits for `release`: the client is killed there),
`corrupt` (file names whose GETs send other bytes of the same size than the tree's sha256 and the
ETag name, as a proxy or a disk that damages them would).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

INFO = re.compile(r"^/api/models/([^/]+/[^/]+)/revision/([^/]+)$")
TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)$")
RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


def commit_of(repo: str) -> str:
    return hashlib.sha1(repo.encode()).hexdigest()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class LocalHub:
    """Repos (repo id -> folder) served at `url` until `close()`."""

    def __init__(self, repos: dict[str, Path]):
        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.drop_once: set[str] = set()
        self.hang: set[str] = set()
        self.corrupt: set[str] = set()
        self.hanging, self.release = threading.Event(), threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.hub = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}"

    def files(self, repo: str) -> list[str]:
        folder = self.repos[repo]
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub: every answer has a Content-Length

    def log_message(self, format: str, *args) -> None:
        pass

    @property
    def hub(self) -> LocalHub:
        return self.server.hub

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append((self.command, path, self.headers.get("Range")))
        for pattern, answer in ((INFO, self._info), (TREE, self._tree), (RESOLVE, self._file)):
            found = pattern.match(path)
            if found:
                repo, revision = found.group(1), found.group(2)
                if repo not in self.hub.repos:
                    return self._json(401, {"error": "Repository not found"}, "RepoNotFound")
                if revision not in ("main", commit_of(repo)):
                    return self._json(404, {"error": "Invalid rev id"}, "RevisionNotFound")
                return answer(repo, *found.groups()[2:], head=head)
        self._json(404, {"error": "not found"})

    def _info(self, repo: str, head: bool) -> None:
        siblings = [{"rfilename": name} for name in self.hub.files(repo)]
        self._json(200, {"id": repo, "modelId": repo, "sha": commit_of(repo), "siblings": siblings})

    def _tree(self, repo: str, head: bool) -> None:
        entries = []
        for name in self.hub.files(repo):
            data = (self.hub.repos[repo] / name).read_bytes()
            entry = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
            if name.endswith(".safetensors"):  # weights are LFS files on the Hub
                sha256 = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"oid": sha256, "size": len(data), "pointerSize": 134}
            entries.append(entry)
        self._json(200, entries)

    def _file(self, repo: str, name: str, head: bool) -> None:
        path = self.hub.repos[repo] / name
        if name not in self.hub.files(repo):
            return self._json(404, {"error": "Entry not found"}, "EntryNotFound")
        data = path.read_bytes()
        etag = (
            hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob_id(data)
        )
        start = _range_start(self.headers.get("Range"))
        if name in self.hub.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 1])
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", commit_of(repo))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        cut = name in self.hub.hang or name in self.hub.drop_once
        if cut:  # half the body, then the connection closes (once the test releases a hang)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            if name in self.hub.hang:
                self.hub.hanging.set()
                self.hub.release.wait(60)
            else:
                self.hub.drop_once.discard(name)
            self.close_connection = True
            return
        self.wfile.write(body)

    def _json(self, status: int, body, error_code: str | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if error_code:
            self.send_header("X-Error-Code", error_code)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _range_start(header: str | None) -> int:
    found = re.fullmatch(r"bytes=(\d+)-", header or "")
    return int(found.group(1)) if found else 0
