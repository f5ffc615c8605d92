"""`tokenmill speculator train`: a draft head for a model, from recorded traffic or its own
answers to a prompt file; prints acceptance and the measured speedup on the held-out part."""

from __future__ import annotations

import argparse
import math
import time


def add_speculator_parser(sub) -> None:
    spec = sub.add_parser("speculator", help="draft heads for speculative decoding")
    ssub = spec.add_subparsers(dest="speculator_command", required=True)
    tr = ssub.add_parser(
        "train",
        help="train a draft head on the model's hidden states over traffic (CPU)",
        description="Trains a draft head (EAGLE-style, tokenmill/spec/draft_head.py) for "
        "--model on recorded traffic (--traces DIR, as `serve --record-traffic DIR` writes) "
        "or on the model's own greedy answers to --prompts FILE, with a held-out split.",
    )
    tr.add_argument("--model", default=None, help="model path (default: the embedded model)")
    src = tr.add_mutually_exclusive_group()
    src.add_argument("--traces", default=None, metavar="DIR", help="JSONL traces to train on")
    src.add_argument(
        "--prompts",
        default=None,
        metavar="FILE",
        help="prompts answered by the model itself (default without --traces: the built-in "
        "chat prompts, tokenmill/spec/data/self_distill_prompts.txt)",
    )
    tr.add_argument(
        "--max-prompts",
        type=int,
        default=320,
        metavar="N",
        help="answer the first N prompts (0: all; the built-in file has 4,321: ~40 min of "
        "answers and ~25 min of hidden states on 2 cores, for a head that drafts better)",
    )
    tr.add_argument("--out", required=True, metavar="FILE", help="the draft head (.safetensors)")
    tr.add_argument(
        "--save-traces",
        default=None,
        metavar="DIR",
        help="also write the self-distilled answers there as traces (reuse with --traces)",
    )
    tr.add_argument("--noise", type=float, default=0.5, help="feature noise (x RMS) in training")
    tr.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay")
    tr.add_argument("--max-tokens", type=int, default=256, help="answer length (self-distill)")
    tr.add_argument("--max-len", type=int, default=1024, help="tokens per sequence, at most")
    tr.add_argument("--epochs", type=int, default=4)
    tr.add_argument("--lr", type=float, default=2e-3)
    tr.add_argument("--draft-vocab", type=int, default=4096, help="draft vocabulary size")
    tr.add_argument("--held-out", type=float, default=0.1, help="fraction kept for evaluation")
    tr.add_argument("--num-speculative-tokens", type=int, default=3, metavar="K")
    tr.add_argument("--no-measure", action="store_true", help="skip the speedup measurement")
    tr.add_argument("--seed", type=int, default=0)
    tr.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tokenmill.engine.llm import LLM
    from tokenmill.spec import training as T
    from tokenmill.spec.draft_head import DraftHead
    from tokenmill.spec.draft_proposer import model_fingerprint, target_readout

    log = Console(stderr=True)

    if not 0 < args.held_out < 1:
        raise ValueError("--held-out: a fraction in (0, 1)")
    if not all(0 <= x < math.inf for x in (args.noise, args.weight_decay)):
        raise ValueError("--noise and --weight-decay: 0 or more, finite")
    if not 1 <= args.num_speculative_tokens <= 7:
        raise ValueError("--num-speculative-tokens: 1..7")
    llm = LLM(args.model, kv_cache_memory_gib=0.5)
    model = llm.engine.core.model
    if args.traces:
        traces = T.read_traces(args.traces)
        log.print(f"{len(traces)} traces from {args.traces}")
    else:
        prompts = T.read_prompts(args.prompts or T.BUILTIN_PROMPTS)
        if args.max_prompts < 0:
            raise ValueError("--max-prompts: 0 (all) or more")
        prompts = prompts[: args.max_prompts or None]
        log.print(f"self-distillation: answering {len(prompts)} prompts ...")
        traces, dt = T.timed(T.self_distill, llm, prompts, args.max_tokens)
        log.print(f"  {dt:.0f}s")
        if args.save_traces:
            T.write_traces(args.save_traces, traces)
    if len(traces) < 2:
        raise ValueError("need at least 2 traces (some are held out)")
    train_traces, held = T.split(traces, args.held_out, args.seed)
    seqs = [T.tokenize(llm, t, args.max_len) for t in train_traces]
    held_seqs = [T.tokenize(llm, t, args.max_len) for t in held]
    cfg = model.config
    vocab = T.draft_vocabulary([ids for ids, _ in seqs], args.draft_vocab, cfg.vocab_size)
    readout = target_readout(model, vocab)
    log.print(f"collecting hidden states over {len(seqs)} sequences ...")
    data, dt = T.timed(T.collect, llm, [ids for ids, _ in seqs])
    log.print(f"  {data.features.shape[0]} examples, {dt:.0f}s")
    head = DraftHead(cfg.hidden_size, 2 * cfg.hidden_size, vocab)
    t0 = time.perf_counter()
    T.train(
        head, readout, data, args.epochs, args.lr, noise=args.noise,
        weight_decay=args.weight_decay, seed=args.seed,
        progress=lambda e, loss: log.print(f"  epoch {e + 1}/{args.epochs}: loss {loss:.3f}"),
    )  # fmt: skip
    log.print(f"trained in {time.perf_counter() - t0:.0f}s")
    k = args.num_speculative_tokens
    held_len = T.acceptance_length(head, readout, llm, held_seqs, k)
    train_len = T.acceptance_length(head, readout, llm, seqs[: len(held_seqs) or 1], k)
    print(f"acceptance length (K={k}): held-out {held_len:.2f}, training {train_len:.2f}")
    head.save(
        args.out, args.model or "embedded", model_fingerprint(model), cfg.vocab_size,
        {"held_out_acceptance_length": f"{held_len:.3f}", "k": str(k)},
    )  # fmt: skip
    print(f"wrote {args.out}")
    if not args.no_measure and held:
        off, on, accept = measure_speedup(llm, args.model, args.out, held, args.max_tokens, k)
        print(
            f"held-out decode: {off:.1f} tok/s without, {on:.1f} tok/s with the draft head "
            f"and its n-gram lookup ({on / off:.2f}x), acceptance length {accept:.2f}"
        )
    return 0


def measure_speedup(llm, model: str | None, path: str, held, max_tokens: int, k: int):
    """Greedy decode tok/s on the held-out prompts without and with the head (one engine
    each, same prompts, prefill included): (off, on, acceptance length)."""
    from tokenmill.engine.llm import LLM
    from tokenmill.sampling_params import SamplingParams
    from tokenmill.spec.training import tokenize

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    prompts = []
    for trace in held:
        ids, n = tokenize(llm, trace, llm.engine.core.max_model_len - max_tokens)
        prompts.append({"prompt_token_ids": ids[:n]})
    spec = LLM(model, kv_cache_memory_gib=0.5, speculator=path, num_speculative_tokens=k)
    rates = []
    for engine in (llm, spec):
        engine.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up
        tokens, seconds = 0, 0.0
        for prompt in prompts:
            t = time.perf_counter()
            out = engine.generate([prompt], params)[0]
            seconds += time.perf_counter() - t
            tokens += len(out.outputs[0].token_ids)
        rates.append(tokens / seconds)
    stats = spec.engine.core.drafter.stats
    return rates[0], rates[1], stats.mean_acceptance_length or 1.0
