"""`tokenmill tune`: measures serve configurations on a workload with the benchmark harness
(the defaults first, then a coarse grid, then around the frontier), within a time budget;
picks the best configuration meeting the SLO, writes it as a `serve --config` file and an
HTML report. Trials are stored as they finish: the same command resumes."""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import sys
import time
from pathlib import Path

DEFAULTS: dict = {}  # the defaults' configuration: no flags


def add_tune_parser(sub) -> None:
    from tokenmill.bench.cli import add_load_and_workload_args
    from tokenmill.ports import add_port_range_option

    p = sub.add_parser(
        "tune",
        help="sweep serve settings on a workload, draw the latency/throughput frontier, "
        "pick the best configuration meeting an SLO",
    )
    add_load_and_workload_args(p)
    p.set_defaults(concurrency="32", seed=0, warmup=1)
    t = p.add_argument_group("tune")
    t.add_argument(
        "--trace", default=None, metavar="FILE", help="= --workload trace --dataset FILE"
    )
    t.add_argument("--slo", default=None, help="e.g. ttft=2s,tpot=100ms (bench's --slo)")
    t.add_argument(
        "--slo-attainment", type=float, default=0.9,
        help="share of requests that must meet the SLO (default 0.9)",
    )  # fmt: skip
    t.add_argument("--budget-minutes", type=float, default=30.0)
    t.add_argument("--max-trials", type=int, default=None)
    t.add_argument(
        "--space", default=None, metavar="FILE",
        help="YAML/JSON/TOML mapping of serve flags to candidate lists (default: "
        "max-num-seqs, max-num-batched-tokens, weights)",
    )  # fmt: skip
    t.add_argument("--model", default=None, help="model path (default: the embedded model)")
    t.add_argument("--endpoint", choices=["chat", "completions"], default="completions")
    t.add_argument("--serve-args", default="", help="serve flags fixed for every trial")
    t.add_argument(
        "--repeat-chosen", type=int, default=2,
        help="extra runs of the chosen configuration, for the run-to-run spread",
    )  # fmt: skip
    t.add_argument("--output-dir", default=None, help="default ./tune-results/<timestamp>")
    add_port_range_option(t, "trial servers (and their replicas)")
    t.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    from tokenmill.bench.cli import build_plan
    from tokenmill.bench.config import SLO
    from tokenmill.bench.execute import RunOptions
    from tokenmill.config_file import load_config_file
    from tokenmill.console import OutputConsole
    from tokenmill.tune.frontier import pick
    from tokenmill.tune.report import TuneOutcome, write_report
    from tokenmill.tune.runner import TrialRunner
    from tokenmill.tune.space import SearchSpace, config_argv, launch_command
    from tokenmill.tune.trials import TrialStore

    console = OutputConsole(width=None if sys.stdout.isatty() else 160)
    if args.trace:
        args.workload, args.dataset = "trace", args.trace
    if not 0 < args.slo_attainment <= 1:
        raise ValueError("slo-attainment: must be in (0, 1]")
    if args.budget_minutes <= 0:
        raise ValueError("budget-minutes: must be > 0")
    space = SearchSpace.from_mapping(load_config_file(args.space)) if args.space else (
        SearchSpace.default()
    )  # fmt: skip
    slo = SLO.parse(args.slo)
    plan = build_plan(args)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.output_dir or Path("tune-results") / stamp)
    out.mkdir(parents=True, exist_ok=True)
    store = TrialStore(out / "trials.jsonl")
    if store.trials:
        console.print(f"resuming: {len(store.trials)} trials in {store.path}")
    options = RunOptions(
        slo=slo, seed=args.seed, warmup=args.warmup, max_duration_s=args.max_duration,
        turn_delay_s=args.turn_delay, progress=not args.no_progress,
        wait_idle_s=args.wait_idle,
        # a run on a busy machine runs once more (the harness keeps the less busy one);
        # still busy, the trial is flagged and never chosen
        retry_busy=max(1, args.retry_busy),
    )  # fmt: skip
    runner = TrialRunner(
        plan, options, args.model, out / "logs", console, args.endpoint,
        tuple(shlex.split(args.serve_args)), args.port_range,
    )  # fmt: skip

    session = _Session(args, store, runner, console)
    session.search(space)
    session.settle()
    trials = store.measured()
    chosen = pick([t.point() for t in trials.values()], args.slo_attainment)
    defaults_key = session.defaults_key
    config_path = None
    if chosen is not None:
        config_path = out / "best.yaml"
        best = trials[chosen.key].config
        write_config(
            config_path, [*runner.extra_serve_args, *config_argv(best)], launch_command(best)
        )
    outcome = TuneOutcome(
        trials=trials, attempts=store.attempts(), defaults_key=defaults_key,
        chosen_key=chosen.key if chosen else None,
        workload=(
            f"{args.workload} workload, concurrency {args.concurrency}, input {args.input_len} "
            f"/ output {args.output_len} tokens"
        ),
        slo=args.slo or "", attainment=args.slo_attainment,
        command=shlex.join(["tokenmill", *sys.argv[1:]]), config_path=config_path,
    )  # fmt: skip
    report = write_report(outcome, out)
    console.print(f"report: {report}")
    if config_path is None:
        console.print("[red]no configuration met the SLO[/]")
        return 1
    command = launch_command(trials[chosen.key].config) if chosen else "serve"
    console.print(
        f"chosen configuration: {config_path} (tokenmill {command} --config {config_path})"
    )
    return 0


class _Session:
    """The trials of one tune: the search within the time budget, then the chosen point
    and the defaults run again for their spread."""

    def __init__(self, args: argparse.Namespace, store, runner, console) -> None:
        from tokenmill.tune.space import config_key

        self.args, self.store, self.runner, self.console = args, store, runner, console
        self.started = time.monotonic()
        self.spent: list[float] = []
        self.defaults_key = config_key(DEFAULTS)

    def measure(self, config: dict, attempt: int = 1) -> None:
        from tokenmill.tune.space import config_argv

        trial = self.runner.run(config, attempt)
        self.store.add(trial)
        self.console.print(
            f"trial {len(self.store.trials)}: {' '.join(config_argv(config)) or '(defaults)'} "
            f"-> {trial.total:.1f} tok/s total, {trial.per_user:.1f} per user, SLO attainment "
            f"{trial.slo_attainment}, background {trial.background_cores}"
        )

    def time_left(self) -> bool:
        args = self.args
        elapsed = (time.monotonic() - self.started) / 60
        expected = sum(self.spent) / len(self.spent) / 60 if self.spent else 0.0
        within = args.max_trials is None or len(self.store.measured()) < args.max_trials
        return within and elapsed + expected <= args.budget_minutes

    def search(self, space) -> None:
        """The defaults first, then the search's next point, while the budget lasts."""
        from tokenmill.tune.search import next_config

        while self.time_left():
            done = self.store.measured()
            config = DEFAULTS if self.defaults_key not in done else next_config(
                space, {k: t for k, t in done.items() if k != self.defaults_key},
                self.args.slo_attainment,
            )  # fmt: skip
            if config is None:
                break
            t0 = time.monotonic()
            self.measure(config)
            self.spent.append(time.monotonic() - t0)

    def settle(self) -> None:
        """The chosen point runs again for its spread; if its median moves another point
        ahead, that one runs again too (bounded), so a resumed tune ends where this one does.
        The defaults run as often as the chosen point: the gain compares medians."""
        from tokenmill.tune.frontier import pick

        store, attainment, repeat = self.store, self.args.slo_attainment, self.args.repeat_chosen
        trials = store.measured()
        chosen = pick([t.point() for t in trials.values()], attainment)
        for _ in range(len(trials) * repeat):
            runs = len(store.attempts()[chosen.key]) if chosen is not None else 0
            if chosen is None or runs >= 1 + repeat:
                break
            self.measure(trials[chosen.key].config, attempt=runs + 1)
            trials = store.measured()
            chosen = pick([t.point() for t in trials.values()], attainment)
        for i in range(len(store.attempts().get(self.defaults_key, [])), 1 + repeat):
            if chosen is None or chosen.key == self.defaults_key:
                break
            self.measure(DEFAULTS, attempt=i + 1)


def write_config(path: Path, serve_argv: list[str], command: str = "serve") -> None:
    """The chosen flags as a `serve --config` (or `cluster --config`) file (YAML: flag names
    without dashes in front; a switch as true)."""
    import yaml

    values: dict = {}
    i = 0
    while i < len(serve_argv):
        flag = serve_argv[i].removeprefix("--")
        if i + 1 < len(serve_argv) and not serve_argv[i + 1].startswith("--"):
            values[flag] = _value(serve_argv[i + 1])
            i += 2
        else:
            values[flag] = True
            i += 1
    text = f"# written by tokenmill tune: tokenmill {command} --config {path.name}\n"
    path.write_text(text + (yaml.safe_dump(values, sort_keys=False) if values else "{}\n"))


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    return text
