"""`tokenmill quant eval` and `tokenmill quant search`."""

from __future__ import annotations

import argparse
import json
import sys

from tokenmill.quant.schemes import CALIBRATED_SCHEMES, GROUP_FORMATS, SCHEMES


def add_quant_parser(sub) -> None:
    quant = sub.add_parser("quant", help="quantization fidelity: eval (KLD report), search (plan)")
    qsub = quant.add_subparsers(dest="quant_command", required=True)

    ev = qsub.add_parser(
        "eval",
        help="KL divergence of a scheme from float32 (llama-perplexity's report), with and "
        "without calibration, and a per-layer-group sensitivity table",
    )
    _add_common(ev)
    ev.add_argument("--scheme", choices=SCHEMES, default=None, help="default: native")
    ev.add_argument("--quant-plan", default=None, metavar="FILE", help="evaluate a plan file")
    ev.add_argument(
        "--calibration",
        default=None,
        metavar="TEXT",
        help="'builtin' or a text file; for int8 / q* schemes the report then shows the "
        "scheme with and without calibration side by side",
    )
    ev.add_argument(
        "--outlier-channels",
        type=int,
        default=0,
        metavar="N",
        help="with --calibration: also keep N input channels per layer in float32",
    )
    ev.add_argument("--no-sensitivity", action="store_true", help="skip the per-group table")
    ev.set_defaults(func=cmd_eval)

    se = qsub.add_parser(
        "search",
        help="which layer groups to keep in higher precision to stay under --max-kld at the "
        "best measured speed; writes a plan for `serve --quant-plan`",
    )
    _add_common(se)
    se.add_argument("--scheme", choices=SCHEMES, required=True)
    se.add_argument("--max-kld", type=float, required=True, metavar="X")
    se.add_argument(
        "--keep",
        default="q8_0,float32",
        help=f"higher formats to try, comma-separated (from {', '.join(GROUP_FORMATS)})",
    )
    se.add_argument("--calibration", default=None, metavar="TEXT")
    se.add_argument("--outlier-channels", type=int, default=0, metavar="N")
    se.add_argument("--output", required=True, metavar="FILE", help="where the plan is written")
    se.set_defaults(func=cmd_search)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="GGUF file or HF folder (default: embedded)")
    p.add_argument(
        "--text", default=None, metavar="FILE", help="evaluation text (default: packaged)"
    )
    p.add_argument("--ctx", type=int, default=512, help="tokens per chunk (half are scored)")
    p.add_argument("--chunks", type=int, default=4, help="chunks of the text to score at most")
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


def _bench(args):
    import torch

    from tokenmill.quant.fidelity import FidelityBench
    from tokenmill.quant.progress import Progress

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    if args.ctx < 8 or args.chunks < 1:
        raise ValueError("--ctx must be >= 8 and --chunks >= 1")
    progress = Progress(enabled=not args.no_progress)
    return FidelityBench(args.model, args.text, args.ctx, args.chunks, progress=progress)


def _print_report(title: str, report) -> None:
    print(f"\n## {title}")
    for line in report.lines():
        print(f"  {line}")


def cmd_eval(args: argparse.Namespace) -> int:
    from tokenmill.quant.plan import QuantPlan, read_plan

    if args.quant_plan and (args.scheme or args.calibration):
        raise ValueError("--quant-plan sets the scheme and calibration; give one")
    plan = read_plan(args.quant_plan)[0] if args.quant_plan else QuantPlan(args.scheme or "native")
    bench = _bench(args)
    print(
        f"{bench.float_files.name}: {bench.chunks.num_scored} tokens scored "
        f"({len(bench.chunks.chunks)} chunks of {bench.chunks.ctx}), reference float32"
    )
    figures = {"model": bench.float_files.name, "tokens": bench.chunks.num_scored}
    report = bench.measure(plan)
    _print_report(f"{plan.describe()} vs float32", report)
    figures[plan.describe()] = report.to_dict()
    calibrated = None
    if args.calibration:
        if plan.scheme not in CALIBRATED_SCHEMES:
            raise ValueError(f"--calibration: applies to {CALIBRATED_SCHEMES}")
        cal_plan = QuantPlan(plan.scheme, plan.overrides, args.calibration, args.outlier_channels)
        calibrated = bench.calibrated_weights(cal_plan)
        cal_report = bench.measure(cal_plan, calibrated)
        _print_report(f"{cal_plan.describe()} vs float32", cal_report)
        figures[cal_plan.describe()] = cal_report.to_dict()
        print(f"\n  calibration: mean KLD {report.mean_kld:.6f} -> {cal_report.mean_kld:.6f}")
    if not args.no_sensitivity:
        figures["sensitivity"] = _sensitivity(bench, plan, calibrated)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


def _sensitivity(bench, plan, calibrated) -> dict:
    from tokenmill.quant.groups import sensitivity_groups
    from tokenmill.quant.plan import QuantPlan

    if plan.scheme in ("float32", "bfloat16") or plan.overrides:
        print("\n(sensitivity: needs a plain quantized scheme; skipped)")
        return {}
    fmt = plan.scheme
    print(f"\n## sensitivity: one group in {fmt}, the rest float32")
    print(f"  {'group':24s} {'mean KLD':>10s} {'p99 KLD':>9s} {'same top':>9s} {'MB':>7s}")
    rows = {}
    float_bytes = bench.weight_bytes(QuantPlan("float32"))
    for pattern in sensitivity_groups(bench.num_layers):
        one = QuantPlan("float32", ((pattern, fmt),))
        report = bench.measure(one, calibrated)
        mb = (float_bytes - bench.weight_bytes(one)) / 1e6
        rows[pattern] = report.to_dict()
        print(
            f"  {pattern:24s} {report.mean_kld:10.6f} {report.p99_kld:9.5f} "
            f"{report.same_top_pct:8.2f}% {mb:7.1f}"
        )
        sys.stdout.flush()
    return rows


def cmd_search(args: argparse.Namespace) -> int:
    from tokenmill.quant.plan import write_plan
    from tokenmill.quant.search import search

    keep = tuple(k for k in args.keep.split(",") if k)
    for k in keep:
        if k not in GROUP_FORMATS:
            raise ValueError(f"--keep: {k!r} is not one of {GROUP_FORMATS}")
    if not args.max_kld >= 0:
        raise ValueError("--max-kld must be >= 0")
    bench = _bench(args)
    result = search(
        bench,
        args.scheme,
        args.max_kld,
        keep,
        args.calibration,
        outlier_channels=args.outlier_channels,
    )
    base = result.base
    print(f"{base.plan.describe()}: mean KLD {base.report.mean_kld:.6f}")
    for c in result.tried:
        print(
            f"  candidate {c.plan.describe()}: KLD {c.report.mean_kld:.6f}, "
            f"{c.weight_bytes / 1e6:.1f} MB, {c.decode_tok_s:.1f} tok/s"
        )
    if result.best is None:
        print(f"no plan meets --max-kld {args.max_kld} (keeping every layer in {keep})")
        return 1
    best = result.best
    measured = {
        "mean_kld": best.report.mean_kld,
        "p99_kld": best.report.p99_kld,
        "same_top_pct": best.report.same_top_pct,
        "weight_bytes": best.weight_bytes,
        "decode_tok_s": best.decode_tok_s,
        "max_kld": args.max_kld,
        "model": bench.float_files.name,
    }
    write_plan(args.output, best.plan, measured)
    print(f"plan: {best.plan.describe()} -> {args.output}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"plan": best.plan.to_dict(), "measured": measured}, f, indent=2)
    return 0
