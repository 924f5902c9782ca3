"""Servers as users start them, for the tests that talk to one: a subprocess on 127.0.0.1 and
a free port, waited for, and stopped by PID with every child it left (vLLM's server leaves a
resource tracker and a worker for a moment after SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    """A server process: its OpenAI base URL, and its log (printed when it does not come up)."""

    proc: subprocess.Popen
    url: str
    log: Path

    def models(self) -> dict:
        with urllib.request.urlopen(self.url + "/models", timeout=10) as r:
            return json.loads(r.read())

    def children(self) -> list[int]:
        import psutil

        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> None:
        """Signal the server, wait for it, then end whatever children it left, by PID."""
        children = self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_server(cmd: list[str], log: Path, env: dict[str, str], port: int, timeout_s: float = 600.0) -> Served:
    """Start `cmd` (serving on 127.0.0.1:`port`) and wait until it answers."""
    f = log.open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    f.close()
    served = Served(proc, f"http://127.0.0.1:{port}/v1", log)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            served.models()
            return served
        except urllib.error.HTTPError:  # it answers (a key may be wanted)
            return served
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if proc.poll() is not None or time.monotonic() > deadline:
                served.stop(signal.SIGKILL)
                raise AssertionError(f"{cmd[:4]} did not come up:\n{log.read_text()[-3000:]}") from None
            time.sleep(1.0)


def json_server(status: int, body: dict) -> tuple[object, str]:
    """A stand-in HTTP server on 127.0.0.1 answering every GET and POST with `status` and the
    JSON `body` (started on a thread); (the server, its /v1 base URL). shutdown() and
    server_close() it after."""
    import http.server
    import threading

    data = json.dumps(body).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = answer  # noqa: N815 - http.server's names

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/v1"
