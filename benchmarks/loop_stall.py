"""What rejecting hostile bodies costs an innocent stream: one streamed completion runs while
8 copies of a malformed request arrive at once (sent from another process, so the client's
own work never delays the timestamps); its inter-token gaps during the attack are compared
with the same number of gaps just before it. Rounds repeat each kind.

    python benchmarks/loop_stall.py [--rounds 3] [--kinds ids,nested,detokenize,tools]

Kinds
    ids          /v1/completions, 100,000 negative token ids (~390 KiB)
    nested       /v1/completions, 100 x 1,000 negative token ids
    detokenize   /detokenize, 100,000 negative token ids
    tools        /v1/chat/completions with 20,000 tools (over the 128 allowed)

Reported per kind: the 400s' wall time, the stream's largest gap before and during, and the
growth (during - before; target <= 50 ms, issue 40).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import results as results_file  # noqa: E402
from tokenmill.bench.compare import default_model  # noqa: E402
from tokenmill.bench.peers import ManagedServer, tokenmill_spec  # noqa: E402

ATTACKERS = 8
# sends one body from its own process over raw sockets (a client's own CPU work would slow
# the engine core on a small machine and count as the server's), N times at once when a line
# arrives on its stdin (its start-up is over by then), and prints the statuses
_SENDER = """
import socket, sys, threading
host, port, path, file, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
body = open(file, "rb").read()
head = (f"POST {path} HTTP/1.1\\r\\nHost: {host}\\r\\nContent-Type: application/json\\r\\n"
        f"Content-Length: {len(body)}\\r\\nConnection: close\\r\\n\\r\\n").encode()
codes = []
def one():
    with socket.create_connection((host, port)) as s:
        s.sendall(head + body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    codes.append(reply.split(b" ", 2)[1].decode())
print("ready", flush=True)
sys.stdin.readline()
ts = [threading.Thread(target=one) for _ in range(n)]
[t.start() for t in ts]; [t.join() for t in ts]
print(" ".join(sorted(codes)))
"""


def bodies(model: str) -> dict[str, tuple[str, dict]]:
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(20_000)]
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return {
        "ids": ("/v1/completions", {"model": model, "prompt": [-1] * 100_000}),
        "nested": ("/v1/completions", {"model": model, "prompt": [[-1] * 1000] * 100}),
        "detokenize": ("/detokenize", {"model": model, "tokens": [-1] * 100_000}),
        "tools": ("/v1/chat/completions", {**chat, "tools": tools}),
    }


def stream_arrivals(base: str, model: str, out: list[float], tokens: int) -> None:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": tokens,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                out.append(time.monotonic())


def one_round(base: str, model: str, path: str, file: Path) -> tuple[float, float, float, str]:
    """(attack seconds, largest gap before, largest gap during, statuses)."""
    host, port = base.removeprefix("http://").split(":")
    sender = subprocess.Popen(
        [sys.executable, "-c", _SENDER, host, port, path, str(file), str(ATTACKERS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert sender.stdout.readline().strip() == "ready"
    arrivals: list[float] = []
    reader = threading.Thread(target=stream_arrivals, args=(base, model, arrivals, 600))
    reader.start()
    while len(arrivals) < 100 and reader.is_alive():  # a steady stream first
        time.sleep(0.01)
    t0 = time.monotonic()
    statuses, _ = sender.communicate("go\n", timeout=300)
    t1 = time.monotonic()
    reader.join()
    gaps = [(b, b - a) for a, b in zip(arrivals, arrivals[1:], strict=False)]
    during = [g for at, g in gaps if t0 <= at <= t1 + 0.05]
    before = [g for at, g in gaps if at < t0][-max(len(during), 10) :]
    if len(during) < 2:
        raise RuntimeError("the stream ended before the attack did: raise its length")
    return t1 - t0, max(before), max(during), statuses.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kinds", default="ids,nested,detokenize,tools")
    p.add_argument("--model", default=None)
    p.add_argument("--tokenmill-args", default="", help="extra serve flags")
    results_file.add_arguments(p)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="loop-stall-"))
    spec = tokenmill_spec("tokenmill", args.model or default_model(), args.tokenmill_args)
    with ManagedServer(spec, tmp) as server:
        base = server.base_url
        model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
        table = bodies(model)
        with results_file.capture("loop-stall", args):
            print(
                f"{'kind':11} {'400s (s)':>9} {'gap before':>11} {'gap during':>11} {'growth':>8}"
            )
            for kind in args.kinds.split(","):
                path, body = table[kind]
                file = tmp / f"{kind}.json"
                file.write_bytes(json.dumps(body).encode())
                # once alone first: the server's first large body starts its parse process
                httpx.post(base + path, content=file.read_bytes(), timeout=120,
                           headers={"content-type": "application/json"})  # fmt: skip
                time.sleep(2.0)
                growth, walls = [], []
                for _ in range(args.rounds):
                    wall, before, during, codes = one_round(base, model, path, file)
                    assert set(codes.split()) == {"400"}, codes
                    walls.append(wall)
                    growth.append(during - before)
                    print(f"{kind:11} {wall:9.2f} {before * 1e3:8.1f} ms {during * 1e3:8.1f} ms "
                          f"{(during - before) * 1e3:5.1f} ms", flush=True)  # fmt: skip
                print(f"{kind:11} median growth {statistics.median(growth) * 1e3:.1f} ms, "
                      f"max {max(growth) * 1e3:.1f} ms (target <= 50 ms)\n", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
