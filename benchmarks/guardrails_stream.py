"""The output guardrails over a stream, in-process: µs per output character and characters
held back (fed, not yet emitted, after each delta), with every deterministic scanner on and
with the default rules (email/phone PII redact, secrets block, deny list fallback).

    .venv/bin/python benchmarks/guardrails_stream.py [--repeat 5]

Deltas: token-sized (about 4 characters), one character each, and the whole text at once
(`check_output`). The time is the best of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from tokenmill.gateway.guardrails import OutputChecker, parse_guardrails  # noqa: E402

ALL = [
    {"name": "pii", "scanner": "pii", "action": "redact",
     "entities": ["email", "phone", "credit_card", "iban", "ssn", "ipv4"]},
    {"name": "secrets", "scanner": "secrets", "action": "block"},
    {"name": "deny", "scanner": "deny_list", "action": "fallback",
     "terms": ["acme corp", "globex"], "fallback": "no"},
    {"name": "invisible", "scanner": "invisible", "action": "redact"},
    {"name": "injection", "scanner": "injection", "action": "audit"},
    {"name": "custom", "scanner": "regex", "action": "audit", "pattern": r"(?i)project\s+x"},
]  # fmt: skip
DEFAULTS = [ALL[0] | {"entities": ["email", "phone"]}, ALL[1], ALL[2]]
PROSE = (
    "Hello there, how are you? The quick brown fox jumps over the lazy dog. In 2024 the "
    "team shipped version 1.2.3 of the service, which handles about 1500 requests per second. "
    "Contact jane.doe@example.com or call +1 415 555 2671 for details.\n\n"
    "```python\ndef add(a, b):\n    return a + b\n```\n"
    "Photosynthesis converts light energy into chemical energy; plants, algae and some "
    "bacteria use it. The result is glucose and oxygen, released into the atmosphere. "
)
TEXT = PROSE * 8


def run(config, deltas: list[str]) -> list[int]:
    checker = OutputChecker(config)
    held, fed = [], 0
    for delta in deltas:
        checker.feed(delta)
        fed += len(delta)
        held.append(fed - checker._done)  # raw characters, whatever the masks' lengths
    checker.finish()
    return held


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--repeat", type=int, default=5)
    results_file.add_arguments(parser)
    args = parser.parse_args()
    chunkings = {
        "tokens": re.findall(r"\s*\S{1,4}|\s+", TEXT),
        "chars": list(TEXT),
        "whole": [TEXT],
    }
    with results_file.capture("guardrails-stream", args):
        measure(args, chunkings)


def measure(args: argparse.Namespace, chunkings: dict[str, list[str]]) -> None:
    for name, rules in (("all scanners", ALL), ("defaults", DEFAULTS)):
        config = parse_guardrails({"rules": rules})
        for chunking, deltas in chunkings.items():
            best = float("inf")
            for _ in range(args.repeat):
                started = time.perf_counter()
                run(config, deltas)
                best = min(best, time.perf_counter() - started)
            held = run(config, deltas)
            print(
                f"{name:12} {chunking:6} {best / len(TEXT) * 1e6:6.2f} µs/char  held: mean "
                f"{statistics.mean(held):5.1f}, median {statistics.median(held):3.0f}, max {max(held)}"
            )


if __name__ == "__main__":
    main()
