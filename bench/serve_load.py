"""`rose-ray serve` under load and bad input.

Builds the tiny student (rose_ray.provision.tiny.init_tiny, a temp dir unless --models), starts
`rose-ray serve` on 127.0.0.1 as a subprocess, and runs two phases, each bounded by a request
count and a wall time, with CONCURRENCY client threads (one HTTP connection per request):

  good   well-formed requests only: completions as the openai backend sends them (prompt
         token ids, logprobs, token ids back) and chat completions, alternately;
  mixed  every other request is a bad one, taken in turn from: malformed JSON, a body over
         the server's limit (with Content-Length, and chunked), a wrong API key, `stream:
         true`, a bad field, JSON nested too deeply, a client that closes its socket right
         after its request or partway through its body, a client that resets the connection
         while its request is being generated.

Reports per phase requests/s, p50/p95/max latency of the good requests, and per kind the
answers by status; then whether the server is still up, answers /health and a good request,
how many tracebacks it logged, and its peak memory.

    python bench/serve_load.py            # default, ~2 minutes on 2 cores
    python bench/serve_load.py --quick    # smoke run, ~30 s

Prints the tables and writes bench/results/serve_load.json (--quick: serve_load_quick.json), the
latest; each run keeps its own copy in bench/results/serve_load[_quick]/version_N/.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from rose_ray.inference.protocol import max_body_bytes  # noqa: E402
from rose_ray.runs import keep_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HOST = "127.0.0.1"
KEY = "bench-key"
NAME = "tiny"
GOOD = ("completion", "chat")
BAD = ("malformed_json", "oversize", "wrong_key", "stream", "bad_field", "oversize_chunked",
       "nested_json", "disconnect", "disconnect_mid_body", "reset_while_generating")
# What each kind must get back; None: the client hangs up, so there is no answer to read.
EXPECTED: dict[str, int | None] = {
    "completion": 200, "chat": 200, "malformed_json": 400, "oversize": 413, "oversize_chunked": 413,
    "wrong_key": 401, "stream": 400, "bad_field": 400, "nested_json": 400, "disconnect": None,
    "disconnect_mid_body": None, "reset_while_generating": None,
}
OBSERVATIONS = [
    "You are in the kitchen. You see a fridge, a stove, a sink and a table.",
    "The fridge is now open. In it you see a glass of orange juice.",
    "You move to the hallway. Doors lead to the kitchen, the workshop and outside.",
    "You pick up the thermometer. It reads 21 degrees celsius.",
]


class Client:
    """Builds and sends one request of a kind: (status or None, latency s, message, problem)."""

    def __init__(self, port: int, max_tokens: int, max_body: int, prompt_ids: list[int],
                 timeout_s: float) -> None:
        self.port, self.max_tokens, self.max_body = port, max_tokens, max_body
        self.prompt_ids, self.timeout_s = prompt_ids, timeout_s

    def messages(self, i: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": "You are an agent in a science world. Answer with Thought and Action."},
                {"role": "assistant", "content": "OK"},
                {"role": "user", "content": OBSERVATIONS[i % len(OBSERVATIONS)]}]

    def completion_body(self, i: int) -> dict[str, Any]:
        # As OpenAIEngine sends it: ids in, ids and logprobs out.
        return {"model": NAME, "prompt": self.prompt_ids + [10 + i % 50], "max_tokens": self.max_tokens,
                "temperature": 1.0, "seed": i, "logprobs": 0, "return_tokens_as_token_ids": True}

    def chat_body(self, i: int) -> dict[str, Any]:
        return {"model": NAME, "messages": self.messages(i), "max_tokens": self.max_tokens,
                "temperature": 1.0, "seed": i}

    def http(self, path: str, body: bytes | Iterator[bytes], key: str = KEY,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout_s)
        try:
            hdrs = {"Content-Type": "application/json", "Authorization": f"Bearer {key}", **(headers or {})}
            conn.request("POST", path, body=body, headers=hdrs)  # an iterator goes chunked
            resp = conn.getresponse()
            raw = resp.read()
            try:
                out = json.loads(raw)
            except ValueError:
                out = {"error": {"message": raw[:200].decode(errors="replace")}}
            return resp.status, out
        finally:
            conn.close()

    def raw(self, data: bytes, pause_s: float = 0.0, reset: bool = False) -> None:
        with socket.create_connection((HOST, self.port), timeout=self.timeout_s) as s:
            s.sendall(data)
            if pause_s:
                time.sleep(pause_s)
            if reset:  # SO_LINGER 0: close sends RST, not FIN
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def request_bytes(self, path: str, body: bytes, length: int | None = None) -> bytes:
        head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body) if length is None else length}\r\n\r\n")
        return head.encode() + body

    def send(self, kind: str, i: int) -> tuple[int | None, float, str, str]:
        dumps = lambda b: json.dumps(b).encode()  # noqa: E731
        t0 = time.perf_counter()
        problem = ""
        if kind == "completion":
            status, out = self.http("/v1/completions", dumps(self.completion_body(i)))
            if status == 200 and not out["choices"][0]["token_ids"]:
                problem = "empty completion"
        elif kind == "chat":
            status, out = self.http("/v1/chat/completions", dumps(self.chat_body(i)))
            if status == 200 and not isinstance(out["choices"][0]["message"].get("content"), str):
                problem = "no message"
        elif kind == "malformed_json":
            status, out = self.http("/v1/completions", b'{"prompt": [1, 2, 3], "max_tokens": ')
        elif kind == "oversize":
            status, out = self.http("/v1/completions", b'{"prompt": "' + b"a" * (self.max_body + 1024) + b'"}')
        elif kind == "oversize_chunked":  # no Content-Length: the server counts as it reads
            chunk = b"b" * (1 << 20)
            n = self.max_body // len(chunk) + 2
            status, out = self.http("/v1/completions", iter([b'{"prompt": "'] + [chunk] * n + [b'"}']))
        elif kind == "wrong_key":
            status, out = self.http("/v1/completions", dumps(self.completion_body(i)), key="not-the-key")
        elif kind == "stream":
            status, out = self.http("/v1/chat/completions", dumps({**self.chat_body(i), "stream": True}))
        elif kind == "bad_field":
            status, out = self.http("/v1/completions", dumps({**self.completion_body(i), "temperature": "hot"}))
        elif kind == "nested_json":
            status, out = self.http("/v1/completions", b"[" * 100_000 + b"]" * 100_000)
        elif kind == "disconnect":  # the whole request, then gone before the reply
            self.raw(self.request_bytes("/v1/completions", dumps(self.completion_body(i))))
            return None, time.perf_counter() - t0, "", ""
        elif kind == "disconnect_mid_body":  # says 10,000 bytes, sends 100, leaves
            self.raw(self.request_bytes("/v1/completions", b'{"prompt": ' + b" " * 89, length=10_000))
            return None, time.perf_counter() - t0, "", ""
        elif kind == "reset_while_generating":
            body = dumps({**self.completion_body(i), "max_tokens": 4 * self.max_tokens})
            self.raw(self.request_bytes("/v1/completions", body), pause_s=0.05, reset=True)
            return None, time.perf_counter() - t0, "", ""
        else:
            raise ValueError(kind)
        latency = time.perf_counter() - t0
        message = ""
        if status != 200:
            error = out.get("error") if isinstance(out, dict) else None
            message = str(error.get("message", "")) if isinstance(error, dict) else ""
            if not message:
                problem = "an error without a message"
        return status, latency, message, problem


def run_phase(client: Client, schedule: Callable[[int], str], requests: int, seconds: float,
              concurrency: int) -> dict[str, Any]:
    """CONCURRENCY threads take request numbers in turn until `requests` or `seconds` run out."""
    lock = threading.Lock()
    state = {"next": 0}
    records: list[dict[str, Any]] = []
    deadline = time.perf_counter() + seconds

    def worker() -> None:
        while True:
            with lock:
                i = state["next"]
                if i >= requests or time.perf_counter() > deadline:
                    return
                state["next"] += 1
            kind = schedule(i)
            try:
                status, latency, message, problem = client.send(kind, i)
                outcome = str(status) if status is not None else "hung up"
            except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out
                status, latency, message, outcome = None, float("nan"), "", "client error"
                problem = f"{type(e).__name__}: {e}"
            expected = EXPECTED[kind]
            ok = not problem and (outcome == "hung up" if expected is None else status == expected)
            with lock:
                records.append({"kind": kind, "status": status, "outcome": outcome, "latency_s": latency,
                                "ok": ok, "message": message[:160], "problem": problem[:160]})

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    good = sorted(r["latency_s"] for r in records if r["kind"] in GOOD and r["ok"])
    kinds: dict[str, Any] = {}
    for kind in sorted({r["kind"] for r in records}, key=lambda k: (k not in GOOD, k)):
        mine = [r for r in records if r["kind"] == kind]
        answered = [r["latency_s"] for r in mine if r["status"] is not None]
        kinds[kind] = {"n": len(mine), "expected": EXPECTED[kind], "outcomes": dict(Counter(r["outcome"] for r in mine)),
                       "p50_ms": 1000 * statistics.median(answered) if answered else None,
                       "unexpected": sum(not r["ok"] for r in mine),
                       "message": next((r["message"] for r in mine if r["message"]), ""),
                       "problems": sorted({r["problem"] or r["outcome"] for r in mine if not r["ok"]})[:3]}
    return {
        "requests": len(records), "seconds": wall, "requests_per_s": len(records) / wall,
        "good": len(good), "good_per_s": len(good) / wall,
        "p50_ms": 1000 * statistics.median(good) if good else None,
        "p95_ms": 1000 * good[min(len(good) - 1, int(0.95 * len(good)))] if good else None,
        "max_ms": 1000 * good[-1] if good else None,
        "unexpected": sum(not r["ok"] for r in records), "kinds": kinds,
    }


def wait_up(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} while starting")
        try:
            if health(port) == 200:
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit("the server did not come up")


def health(port: int) -> int:
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    finally:
        conn.close()


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def print_tables(phases: dict[str, Any], server: dict[str, Any]) -> None:
    head = (f"{'phase':<6} {'requests':>8} {'seconds':>7} {'req/s':>6} {'good':>5} {'good/s':>6} "
            f"{'p50 ms':>7} {'p95 ms':>7} {'max ms':>7} {'unexpected':>10}")
    print(head)
    print("-" * len(head))
    def ms(v: float | None) -> str:
        return f"{v:>7.0f}" if v is not None else f"{'-':>7}"

    for name, ph in phases.items():
        print(f"{name:<6} {ph['requests']:>8} {ph['seconds']:>7.1f} {ph['requests_per_s']:>6.1f} {ph['good']:>5} "
              f"{ph['good_per_s']:>6.1f} {ms(ph['p50_ms'])} {ms(ph['p95_ms'])} {ms(ph['max_ms'])} "
              f"{ph['unexpected']:>10}")
    print()
    head = f"{'phase':<6} {'kind':<23} {'n':>4} {'expected':>8} {'p50 ms':>7}  answers"
    print(head)
    print("-" * 80)
    for name, ph in phases.items():
        for kind, k in ph["kinds"].items():
            answers = ", ".join(f"{o}: {c}" for o, c in sorted(k["outcomes"].items()))
            expected = k["expected"] if k["expected"] is not None else "hang up"
            flag = f"  UNEXPECTED {k['unexpected']}: {k['problems']}" if k["unexpected"] else ""
            print(f"{name:<6} {kind:<23} {k['n']:>4} {expected!s:>8} {ms(k['p50_ms'])}  {answers}{flag}")
    print()
    mixed = phases.get("mixed", {}).get("kinds", {})
    for kind in BAD:
        if mixed.get(kind, {}).get("message"):
            print(f"{kind:<17} -> {mixed[kind]['message']}")
    print()
    print(f"server: {'up' if server['alive'] else 'DEAD'}; /health after load: {server['health']}; a good "
          f"request after load: {server['final_request']}; tracebacks logged: {server['tracebacks']}; "
          f"peak RSS {server['peak_rss_mb']:.0f} MB; body limit {server['max_body']:,} bytes")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: few requests, short phases")
    p.add_argument("--requests", type=int, default=2000, help="per phase (--quick: 80)")
    p.add_argument("--seconds", type=float, default=60.0, help="wall-time bound per phase (--quick: 12)")
    p.add_argument("--concurrency", type=int, default=32, help="client threads (--quick: 8)")
    p.add_argument("--max-tokens", type=int, default=16, help="new tokens per good request")
    p.add_argument("--context-tokens", type=int, default=4096, help="the server's (sizes its body limit)")
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--server-threads", type=int, default=1, help="torch threads of the server")
    p.add_argument("--timeout", type=float, default=60.0, help="client socket timeout, seconds")
    p.add_argument("--models", default=None, help="where init_tiny builds/reuses (default: a temp dir)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.quick:
        args.requests, args.seconds, args.concurrency = min(args.requests, 80), min(args.seconds, 12.0), 8
    out_path = Path(args.out or RESULTS / ("serve_load_quick.json" if args.quick else "serve_load.json"))

    from rose_ray.provision.tiny import init_tiny

    tmp = tempfile.TemporaryDirectory(prefix="serve_load_")
    model = init_tiny(args.models or Path(tmp.name) / "models")["student"]
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    log_path = Path(tmp.name) / "server.log"
    cmd = [sys.executable, "-m", "rose_ray.cli", "serve", str(model), "--host", HOST, "--port", str(port),
           "--api-key", KEY, "--served-model-name", NAME, "--dtype", "float32",
           "--threads", str(args.server_threads), "--context-tokens", str(args.context_tokens),
           "--max-batch-size", str(args.max_batch_size)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server: dict[str, Any] = {}
    finished = False
    try:
        t0 = time.perf_counter()
        wait_up(port, proc, 180)
        startup_s = time.perf_counter() - t0
        max_body = max_body_bytes(args.context_tokens)
        client = Client(port, args.max_tokens, max_body, [], args.timeout)
        # The server renders the conversation; its ids become the completions prompt.
        status, out = client.http("/v1/chat/completions", json.dumps(client.chat_body(0)).encode())
        assert status == 200, out
        client.prompt_ids = out["prompt_token_ids"]
        client.send("completion", 0)  # warm-up

        phases = {
            "good": run_phase(client, lambda i: GOOD[i % 2], args.requests, args.seconds, args.concurrency),
            "mixed": run_phase(client, lambda i: GOOD[(i // 2) % 2] if i % 2 == 0 else BAD[(i // 2) % len(BAD)],
                               args.requests, args.seconds, args.concurrency),
        }
        time.sleep(0.5)  # let the hung-up requests finish generating
        alive = proc.poll() is None
        server = {"alive": alive, "health": None, "final_request": None, "startup_s": startup_s,
                  "max_body": max_body, "peak_rss_mb": peak_rss_mb(proc.pid) or float("nan")}
        if alive:
            server["health"] = health(port)
            server["final_request"] = client.send("completion", 1)[0]
        finished = True
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        text = log_path.read_text(errors="replace")
        tmp.cleanup()
        if not finished:
            print(f"server log (tail):\n{text[-3000:]}", file=sys.stderr)
    server["tracebacks"] = text.count("Traceback")
    server["log_tail"] = text[-2000:]
    by_kind: dict[str, Counter] = defaultdict(Counter)
    for ph in phases.values():
        for kind, k in ph["kinds"].items():
            by_kind[kind].update(k["outcomes"])

    print(f"rose-ray serve, tiny student (float32, {args.server_threads} torch thread), context "
          f"{args.context_tokens}, max batch {args.max_batch_size}; {args.concurrency} client threads, "
          f"{args.max_tokens} new tokens per good request; up to {args.requests} requests or "
          f"{args.seconds:.0f} s per phase; {os.cpu_count()} cores")
    print()
    print_tables(phases, server)
    kept = keep_result(out_path, json.dumps({
        "bench": "serve_load", "quick": args.quick, "args": vars(args), "phases": phases,
        "outcomes_by_kind": {k: dict(v) for k, v in by_kind.items()}, "server": server,
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
    }, indent=1))
    print(f"\nwrote {out_path} (and {kept})")
    failed = not (server["alive"] and server["health"] == 200 and server["final_request"] == 200)
    if failed or any(ph["unexpected"] for ph in phases.values()) or server["tracebacks"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
