"""A stand-in for the Hugging Face hub on 127.0.0.1: model folders served under repo ids, each at
one commit, through the routes `huggingface_hub.snapshot_download` calls (read in its code,
huggingface_hub 2.4; `HF_ENDPOINT=http://127.0.0.1:PORT` points the real client here):

    GET       /api/models/<id>/revision/<rev>      the repo's info: its commit `sha`
    GET       /api/models/<id>/tree/<sha>          its files: path, size, `oid` (git blob sha1)
    HEAD|GET  /<id>/resolve/<rev>/<path>           a file, with `X-Repo-Commit` and `ETag`

An unknown repo or revision answers 404 with the hub's `X-Error-Code`, so the client raises
the errors it raises against the hub. Every request is recorded (`requests`, and one line per
request in `--log FILE`), so a caller can count what was downloaded. launch/rehearse.sh serves
its stand-in models with it; tests/conftest.py's `hub_endpoint` fixture runs it in a thread.

    python launch/hub_server.py [--port P] [--log FILE] ORG/NAME=DIR ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def blob_sha1(data: bytes) -> str:
    """The git blob id the hub gives a (non-LFS) file as its `oid` and ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, repo_id: str, folder: Path) -> None:
        self.repo_id, self.folder = repo_id, Path(folder)
        self.files = {p.relative_to(self.folder).as_posix(): p for p in sorted(self.folder.rglob("*")) if p.is_file()}
        if not self.files:
            raise ValueError(f"{repo_id}: {folder} holds no files")
        self.oids = {path: blob_sha1(p.read_bytes()) for path, p in self.files.items()}
        # One commit per content: the same folder served again has the same sha.
        self.sha = hashlib.sha1(json.dumps(sorted(self.oids.items())).encode()).hexdigest()


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, repos: dict[str, Path], port: int = 0, log: Path | None = None) -> None:
        self.repos = {repo_id: Repo(repo_id, folder) for repo_id, folder in repos.items()}
        self.requests: list[tuple[str, str]] = []  # (method, path) in arrival order
        self.log = log
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def record(self, method: str, path: str) -> None:
        with self.lock:
            self.requests.append((method, path))
            if self.log is not None:
                with open(self.log, "a") as f:
                    f.write(f"{method} {path}\n")

    def file_downloads(self) -> Counter:
        """(repo id, file) -> how many times its content was sent (GET on /resolve/)."""
        return file_downloads(self.requests, self.repos)

    def start(self) -> HubServer:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def file_downloads(requests: list[tuple[str, str]], repo_ids) -> Counter:
    counts: Counter = Counter()
    for method, path in requests:
        for repo_id in repo_ids:
            prefix = f"/{repo_id}/resolve/"
            if method == "GET" and path.startswith(prefix):
                counts[(repo_id, path[len(prefix):].split("/", 1)[1])] += 1
    return counts


class Handler(BaseHTTPRequestHandler):
    server: HubServer

    def log_message(self, format: str, *args) -> None:  # the requests are recorded, not printed
        pass

    def do_HEAD(self) -> None:
        self.answer(body=False)

    def do_GET(self) -> None:
        self.answer(body=True)

    def answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.server.record(self.command, path)
        api = path.startswith("/api/models/")
        rest = path[len("/api/models/"):] if api else path[1:]
        repo = next((r for r in self.server.repos.values() if rest.startswith(r.repo_id + "/")), None)
        if repo is None:
            return self.error(404, "RepoNotFound", "Repository not found")
        kind, _, tail = rest[len(repo.repo_id) + 1:].partition("/")
        revision, _, file = tail.partition("/")
        if revision not in ("main", repo.sha):
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if api and kind == "revision":
            info = {"id": repo.repo_id, "sha": repo.sha, "private": False,
                    "siblings": [{"rfilename": f} for f in repo.files]}
            return self.send(json.dumps(info).encode(), "application/json", repo, body)
        if api and kind == "tree":
            tree = [{"type": "file", "path": f, "size": repo.files[f].stat().st_size, "oid": repo.oids[f]}
                    for f in repo.files if f.startswith(file)]
            return self.send(json.dumps(tree).encode(), "application/json", repo, body)
        if not api and kind == "resolve" and file in repo.files:
            return self.send(repo.files[file].read_bytes(), "application/octet-stream", repo, body,
                             etag=repo.oids[file])
        return self.error(404, "EntryNotFound", f"{path} not found", repo)

    def send(self, data: bytes, content_type: str, repo: Repo, body: bool, etag: str | None = None) -> None:
        start = 0
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes=") and ranged[6:].split("-")[0].isdigit():  # a resumed download
            start = int(ranged[6:].split("-")[0])
        self.send_response(206 if start else 200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("X-Repo-Commit", repo.sha)
        if etag:
            self.send_header("ETag", f'"{etag}"')
        self.end_headers()
        if body:
            self.wfile.write(data[start:])

    def error(self, status: int, code: str, message: str, repo: Repo | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if repo is not None:
            self.send_header("X-Repo-Commit", repo.sha)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--log", type=Path, help="append one line per request (METHOD PATH)")
    parser.add_argument("repos", nargs="+", metavar="ORG/NAME=DIR")
    args = parser.parse_args(argv)
    repos = dict(pair.split("=", 1) for pair in args.repos)
    server = HubServer({k: Path(v) for k, v in repos.items()}, port=args.port, log=args.log)
    for repo in server.repos.values():
        print(f"hub: {repo.repo_id} ({len(repo.files)} files, commit {repo.sha[:12]}) from {repo.folder}", flush=True)
    print(f"hub: serving on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
