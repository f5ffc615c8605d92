"""How the loop cut-off defaults were chosen: generate with the cut-off off, then replay the
token streams through detectors of several settings.

- loops: prompts on which the embedded model at greedy repeats forever; reported is how many
  tokens each setting lets through before cutting (lower is better);
- natural: ordinary chat prompts at temperature 0 and 0.7 whose outputs do not loop by eye;
  reported is how many of them each setting would cut (false positives; lower is better).

    python benchmarks/loop_cutoff.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from tokenmill import LLM, SamplingParams  # noqa: E402
from tokenmill.sampling_params import RepetitionDetection  # noqa: E402
from tokenmill.structured.loops import RepetitionDetector  # noqa: E402

LOOP_PROMPTS = [
    "List of numbers: 1, 1, 1, 1, 1,",
    "Repeat after me: hello hello hello hello",
    "a b a b a b a b",
    "The the the the the the",
]
NATURAL_TOPICS = [
    "Explain how a bicycle works.", "Write a short poem about autumn.", "What is photosynthesis?",
    "Give me three tips for learning Python.", "Describe the city of Paris.", "How do vaccines work?",
    "Write a haiku about the sea.", "Summarize the plot of Romeo and Juliet.", "What causes rain?",
    "List five healthy breakfast ideas.", "Explain recursion to a child.", "Why is the sky blue?",
    "Write a product description for a coffee mug.", "What are prime numbers?",
    "Give a recipe for pancakes.", "Describe a day in the life of a cat.", "How does the internet work?",
    "Write a limerick about a dog.", "What is machine learning?", "Tell me about the Moon landing.",
]  # fmt: skip
SETTINGS = [
    RepetitionDetection(32, 3, 24),
    RepetitionDetection(32, 4, 32),
    RepetitionDetection(32, 4, 48),
    RepetitionDetection(32, 6, 64),
    RepetitionDetection(64, 4, 96),
]


def first_cut(tokens: list[int], setting: RepetitionDetection) -> int | None:
    det = RepetitionDetector(setting)
    for i in range(1, len(tokens) + 1):
        if det.update(tokens[:i]):
            return i
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    results_file.add_arguments(parser)
    args = parser.parse_args()
    llm = LLM(kv_cache_memory_gib=1.0)
    off = dict(repetition_detection=False)
    loops = [
        o.outputs[0].token_ids
        for o in llm.generate(LOOP_PROMPTS, SamplingParams(temperature=0, max_tokens=400, **off))
    ]
    chats = [[{"role": "user", "content": t}] for t in NATURAL_TOPICS]
    natural = []
    for temperature in (0.0, 0.7):
        outs = llm.chat(
            chats, SamplingParams(temperature=temperature, seed=1, max_tokens=256, **off)
        )
        natural += [o.outputs[0].token_ids for o in outs]
    with results_file.capture("loop-cutoff", args):
        report(loops, natural)


def report(loops: list[list[int]], natural: list[list[int]]) -> None:
    print(
        f"{'setting (period<=, repeats>=, span>=)':40s} {'loop tokens before cut':>28s} {'natural outputs cut':>20s}"
    )
    for s in SETTINGS:
        cuts = [first_cut(t, s) for t in loops]
        false = [i for i, t in enumerate(natural) if first_cut(t, s) is not None]
        shown = ", ".join(str(c) if c is not None else "-" for c in cuts)
        print(
            f"{str((s.max_period, s.min_repeats, s.min_span)):40s} {shown:>28s} {len(false):>9d}/{len(natural)}"
        )
    default = RepetitionDetection()
    print(f"default: {(default.max_period, default.min_repeats, default.min_span)}")


if __name__ == "__main__":
    main()
