"""Speculative decoding: single-stream decode with and without each proposer, next to
llama.cpp's own lookup decoding, and batched throughput with speculation on; one run.

    .venv/bin/python benchmarks/spec_decode.py [--quick] [--tokens N] [--markdown PATH]
        [--skip-llama-cpp] [--skip-batched] [--threads N] [--speculator FILE]

Requests (the embedded model, chat template applied, greedy, `--tokens` output tokens)
    copy    copy-heavy: a ~500-token passage (from the package's evaluation text) to fix
            ("fix the typos, return it in full", typos planted), repeat, or rewrite
    chat    ordinary chat: a story, an explanation, advice

Systems
    tokenmill              LLM() defaults, no speculation
    tokenmill ngram auto   --speculative ngram --num-speculative-tokens 7 (draft policy auto:
                           drafts sized by measured step times and acceptance)
    tokenmill ngram K=3    the same with every proposed draft verified (policy fixed, K=3)
    tokenmill draft head   --speculator FILE (a draft head from `tokenmill speculator train`),
                           K up to 7, draft policy auto; n-gram lookup first, the head where
                           it finds nothing (the default)
    tokenmill head alone   the same with --no-speculative-lookup: every draft from the head
    llama.cpp              llama-server, Q4_1 (the same file), one slot: its decode speed
                           (timings.predicted_per_second) on the same prompt text
    llama.cpp lookup       the same server with --spec-type ngram-simple (its prompt-lookup
                           speculative decoding, default sizes: 12-token lookup, up to 48
                           drafted; accepted/drafted tokens shown)

Numbers
    decode tok/s    output tokens after the first / time from the first output token to the
                    last (prefill excluded), summed over the task's requests; tokenmill's
                    systems (each in its own process) take turns request by request, in
                    alternating order, two rounds (--rounds)
    accept len      mean tokens per verification step (accepted drafts + 1), and accepted /
                    drafted tokens
    batched         32 concurrent chat requests, 128 output tokens each: output tokens / wall
                    time with speculation off and with ngram auto, in turns, the median
                    of three each (must stay within 3%)

The machine should be otherwise idle; each system runs after the others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import results as results_file  # noqa: E402
from benchmarks.throughput import MODEL_STEM, llama_cpp_dirs  # noqa: E402
from tokenmill import LLM, SamplingParams  # noqa: E402
from tokenmill.stats import SpecDecodeStats  # noqa: E402

log = Console(stderr=True)
EVALUATION_TEXT = Path(__file__).resolve().parents[1] / "tokenmill/quant/data/evaluation.txt"


def passages(n: int, chars: int = 2000) -> list[str]:
    text = EVALUATION_TEXT.read_text()
    starts = [len(text) * i // (n + 1) for i in range(n)]
    out = []
    for s in starts:
        s = text.index("\n\n", s) + 2 if "\n\n" in text[s:] else s
        out.append(text[s : s + chars].rsplit("\n", 1)[0])
    return out


def plant_typos(text: str) -> str:
    """Swap two letters in every seventh word of 5+ letters (deterministic)."""
    words = text.split(" ")
    count = 0
    for i, w in enumerate(words):
        if len(w) >= 5 and w.isalpha():
            count += 1
            if count % 7 == 0:
                words[i] = w[0] + w[2] + w[1] + w[3:]
    return " ".join(words)


def tasks(quick: bool) -> dict[str, list[str]]:
    p = passages(3, 1200 if quick else 2000)
    copy = [
        f"Fix the typos in the following text and return it in full:\n\n{plant_typos(p[0])}",
        f"Repeat the following text exactly:\n\n{p[1]}",
        f"Rewrite the following text, replacing every 'process' with 'task':\n\n{p[2]}",
    ]
    # none of these is among the draft head's built-in training prompts
    # (tokenmill/spec/data/self_distill_prompts.txt): a trained head is measured on new chat
    chat = [
        "Write a short story about a dragon who is afraid of fire.",
        "Explain how airplanes stay in the air.",
        "What should I consider before adopting a dog?",
    ]
    return {"copy": copy[:2] if quick else copy, "chat": chat[:2] if quick else chat}


@dataclass
class Measured:
    tokens: int = 0
    seconds: float = 0.0
    drafts: int = 0  # verification steps with drafts (tokenmill)
    accepted: int = 0  # accepted draft tokens
    drafted: int = 0  # drafted tokens
    per_request: list[float] = field(default_factory=list)

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")

    @property
    def accept_len(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts else None


def decode_one(llm: LLM, prompt: str, max_tokens: int) -> tuple[int, float]:
    """(tokens after the first, seconds from the first output token to the last)."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    text, ids = engine.processor.render_chat(
        [{"role": "user", "content": prompt}], True, None, None
    )
    rid = engine.new_request_id()
    engine.add_request(rid, {"prompt": text, "prompt_token_ids": ids}, params)
    first = end = None
    n = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            n = len(out.outputs[0].token_ids)
            now = time.perf_counter()
            if first is None and n:
                first = now
            end = now
    return max(n - 1, 0), (end - first) if first and end else 0.0


def _serve_system(conn, kwargs: dict) -> None:
    """One system in a process of its own, as a server runs one engine: decodes the
    requests the parent sends, one at a time, until it sends None."""
    llm = LLM(None, kv_cache_memory_gib=0.5, **kwargs)
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0, max_tokens=8))
    conn.send("ready")
    drafter = llm.engine.core.drafter  # None: speculation off (all counts stay 0)
    stats = drafter.stats if drafter is not None else SpecDecodeStats()
    while (job := conn.recv()) is not None:
        d0, a0, t0 = stats.num_drafts, stats.num_accepted_tokens, stats.num_draft_tokens
        n, s = decode_one(llm, *job)
        conn.send((n, s, stats.num_drafts - d0, stats.num_accepted_tokens - a0,
                   stats.num_draft_tokens - t0))  # fmt: skip


def bench_tokenmill(configs: dict[str, dict], prompts: dict[str, list[str]], tokens: int,
                    rounds: int) -> dict[str, dict[str, Measured]]:  # fmt: skip
    """Every request on every system in turn (this VM's speed drifts over minutes: the
    systems see the same drift; their order alternates), `rounds` times. Each system runs in
    its own process, as a server runs one engine; the others wait, idle."""
    ctx = multiprocessing.get_context("spawn")
    workers = {}
    for name, kw in configs.items():
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve_system, args=(child, kw), daemon=True)
        proc.start()
        workers[name] = (proc, parent)
    results = {name: {task: Measured() for task in prompts} for name in configs}
    try:
        for name, (_, conn) in workers.items():
            if conn.recv() != "ready":
                raise RuntimeError(f"{name}: the system did not start")
        order = list(workers)
        for _ in range(rounds):
            for task, items in prompts.items():
                for prompt in items:
                    order.reverse()  # A B, B A, ...: a steady drift favours no system
                    for name in order:
                        conn = workers[name][1]
                        conn.send((prompt, tokens))
                        n, s, drafts, accepted, drafted = conn.recv()
                        m = results[name][task]
                        m.tokens += n
                        m.seconds += s
                        m.drafts += drafts
                        m.accepted += accepted
                        m.drafted += drafted
                        m.per_request.append(n / s if s else float("nan"))
    finally:
        for proc, conn in workers.values():
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    conn.send(None)
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    for name, res in results.items():
        for task, m in res.items():
            log.print(f"{name} {task}: {m.tps:.1f} tok/s, accept len {m.accept_len}")
    return results


def bench_batched(users: int, tokens: int, chat: list[str], **kw) -> float:
    llm = LLM(None, kv_cache_memory_gib=1.0, **kw)
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0, max_tokens=8))
    messages = [[{"role": "user", "content": f"{chat[i % len(chat)]} ({i})"}] for i in range(users)]
    params = SamplingParams(temperature=0, max_tokens=tokens, min_tokens=tokens)
    t = time.perf_counter()
    outs = llm.chat(messages, params)
    dt = time.perf_counter() - t
    return sum(len(o.outputs[0].token_ids) for o in outs) / dt


# --------------------------------------------------------------------------- llama.cpp


def chat_text(llm: LLM, prompt: str) -> str:
    """The prompt as text with the chat template applied (what llama.cpp tokenizes)."""
    return llm.engine.processor.render_chat(
        [{"role": "user", "content": prompt}], True, None, None
    )[0]


def bench_llama_server(
    label: str, server: Path, model: Path, texts: dict, tokens: int, threads: int, extra: list[str]
) -> dict:
    port = 18437
    proc = subprocess.Popen(
        [str(server), "-m", str(model), "-t", str(threads), "--port", str(port), "-np", "1",
         "-c", "4096", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        results = {}
        for task, items in texts.items():
            m = Measured()
            for text in items:
                body = {
                    "prompt": text,
                    "n_predict": tokens,
                    "temperature": 0,
                    "cache_prompt": False,
                }
                req = urllib.request.Request(
                    f"{url}/completion",
                    json.dumps(body).encode(),
                    {"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(req, timeout=600) as r:
                    timings = json.loads(r.read())["timings"]
                m.tokens += timings["predicted_n"]
                m.seconds += timings["predicted_ms"] / 1000
                m.drafted += timings.get("draft_n", 0)
                m.accepted += timings.get("draft_n_accepted", 0)
            results[task] = m
            log.print(
                f"{label} {task}: {m.tps:.1f} tok/s, drafts accepted {m.accepted}/{m.drafted}"
            )
        return results
    finally:
        proc.terminate()
        proc.wait(30)


# --------------------------------------------------------------------------- report


def report(
    systems: dict[str, dict], batched: dict[str, float], markdown: Path | None, args=None
) -> None:
    base = systems["tokenmill"]
    lines = ["| system | copy decode tok/s | vs off | accept len | chat decode tok/s | vs off | accept len |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    table = Table(title="single-stream decode (prefill excluded)")
    for col in ("system", "copy tok/s", "vs off", "accept", "chat tok/s", "vs off", "accept"):
        table.add_column(col)
    for name, res in systems.items():
        own_base = systems.get("llama.cpp") if name.startswith("llama.cpp") else base
        cells = [name]
        for task in ("copy", "chat"):
            m = res[task]
            ratio = m.tps / own_base[task].tps if own_base else float("nan")
            acc = f"{m.accept_len:.2f}" if m.accept_len else "–"
            if m.drafted:
                acc += f" ({m.accepted}/{m.drafted})"
            cells += [f"{m.tps:.1f}", f"{ratio:.2f}x", acc]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console = Console()
    console.print(table)
    if "llama.cpp lookup" in systems:
        for name in ("tokenmill ngram auto", "tokenmill ngram K=3", "tokenmill draft head"):
            if name in systems:
                r = {
                    t: systems[name][t].tps / systems["llama.cpp lookup"][t].tps
                    for t in ("copy", "chat")
                }
                console.print(
                    f"{name} vs llama.cpp lookup: copy {r['copy']:.2f}x, chat {r['chat']:.2f}x"
                )
                lines.append(
                    f"\n{name} vs llama.cpp lookup: copy {r['copy']:.2f}x, chat {r['chat']:.2f}x"
                )
    if batched:
        off, on = batched["off"], batched["ngram auto"]
        line = f"batched 32 users: {off:.1f} tok/s off, {on:.1f} tok/s ngram auto ({on / off:.3f}x)"
        console.print(line)
        lines.append("\n" + line)
    if markdown:
        markdown.write_text("\n".join(lines) + "\n")
    results_file.write("spec-decode", "\n".join(lines), args, title=table.title)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    ap.add_argument("--quick", action="store_true", help="fewer, shorter requests")
    ap.add_argument("--tokens", type=int, default=None, help="output tokens per request")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--skip-llama-cpp", action="store_true")
    ap.add_argument("--skip-batched", action="store_true")
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="times every request runs on every system, in turns (default 2; 1 with --quick): "
        "more rounds average out this VM's drift",
    )
    ap.add_argument(
        "--speculator", default=None, help="a draft head for the embedded model (adds a system)"
    )
    results_file.add_arguments(ap)
    args = ap.parse_args()
    if args.rounds is not None and args.rounds < 1:
        ap.error("--rounds: at least 1")
    tokens = args.tokens or (96 if args.quick else 256)
    prompts = tasks(args.quick)
    log.print(f"load average before: {os.getloadavg()}")
    threads = {"num_threads": args.threads}
    configs = {
        "tokenmill": threads,
        "tokenmill ngram auto": {**threads, "speculative": "ngram", "num_speculative_tokens": 7},
        "tokenmill ngram K=3": {**threads, "speculative": "ngram", "num_speculative_tokens": 3,
                                "speculative_draft_policy": "fixed"},
    }  # fmt: skip
    if args.speculator:
        head = {**threads, "speculator": args.speculator, "num_speculative_tokens": 7}
        configs["tokenmill draft head"] = head
        configs["tokenmill head alone"] = {**head, "speculative_lookup": False}
    rounds = (1 if args.quick else 2) if args.rounds is None else args.rounds
    systems = bench_tokenmill(configs, prompts, tokens, rounds)
    if not args.skip_llama_cpp:
        bin_dir, models = llama_cpp_dirs()
        model = models / f"{MODEL_STEM}.Q4_1.gguf"
        renderer = LLM(None, kv_cache_memory_gib=0.05)
        texts = {t: [chat_text(renderer, p) for p in items] for t, items in prompts.items()}
        if (bin_dir / "llama-server").is_file() and model.is_file():
            server = bin_dir / "llama-server"
            systems["llama.cpp"] = bench_llama_server(
                "llama.cpp", server, model, texts, tokens, args.threads, []
            )
            systems["llama.cpp lookup"] = bench_llama_server(
                "llama.cpp lookup", server, model, texts, tokens, args.threads,
                ["--spec-type", "ngram-simple"],
            )  # fmt: skip
        else:
            log.print(f"[yellow]llama.cpp skipped: llama-server or {model} missing[/]")
    batched = {}
    if not args.skip_batched:
        users, gen = (16, 64) if args.quick else (32, 128)
        spec = {"speculative": "ngram", "num_speculative_tokens": 7}
        runs: dict[str, list[float]] = {"off": [], "ngram auto": []}
        pair = [("off", {}), ("ngram auto", spec)]
        for r in range(3):  # median of three each, in turns (this VM's speed drifts ±5%)
            for name, kw in pair if r % 2 == 0 else pair[::-1]:
                tps = bench_batched(users, gen, prompts["chat"], num_threads=args.threads, **kw)
                runs[name].append(tps)
                log.print(f"batched {users} users, {name}: {tps:.1f} tok/s")
        batched = {name: statistics.median(v) for name, v in runs.items()}
    log.print(f"load average after: {os.getloadavg()}")
    report(systems, batched, args.markdown, args)


if __name__ == "__main__":
    main()
