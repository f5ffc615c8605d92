"""`tokenmill` command line: serve, generate, chat (and more as the platform grows)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Iterator

from tokenmill.config_file import add_config_option, expand_config
from tokenmill.engine.arg_utils import EngineArgs, add_engine_args
from tokenmill.sampling_params import RequestOutputKind, SamplingParams

# exit status of a command whose reader closed the pipe (as SIGPIPE would end it: 128 + 13)
EXIT_BROKEN_PIPE = 141


class ArgumentParser(argparse.ArgumentParser):
    """No abbreviated long options: `--max-num-seq 8` is an error, not `--max-num-seqs 8`.
    Every subcommand's parser is of this class too (argparse builds them of the parent's)."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens)
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument(
        "--sampling-seed", type=int, default=None, help="per-request seed (reproducible sampling)"
    )
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.sampling_seed,
        stop=args.stop,
        output_kind=RequestOutputKind.DELTA,
    )


def stream_text(engine, prompt, params: SamplingParams) -> Iterator[str]:
    """Yields text deltas of one request as the engine produces them."""
    rid = engine.new_request_id()
    engine.add_request(rid, prompt, params)
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == rid and out.outputs[0].text:
                    yield out.outputs[0].text
    finally:
        engine.abort_request(rid)


def cmd_generate(args: argparse.Namespace) -> int:
    from tokenmill.engine.llm import LLM

    try:  # bytes the shell passed that are not UTF-8 arrive as lone surrogates
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("prompt: not valid UTF-8 text") from None
    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    params = sampling_params(args)
    prompt = args.prompt
    if args.chat:
        text, ids = llm.engine.processor.render_chat([{"role": "user", "content": prompt}])
        prompt = {"prompt": text, "prompt_token_ids": ids}
    for piece in stream_text(llm.engine, prompt, params):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from tokenmill.engine.llm import LLM

    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    params = sampling_params(args)
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    if interactive:
        print(
            f"tokenmill chat with {llm.engine.core.model_name} — /reset clears, /exit or Ctrl-D quits"
        )
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        line = line.strip()
        if not line:
            continue
        if line in ("/exit", "/quit"):
            break
        if line == "/reset":
            history = history[:1] if args.system else []
            continue
        history.append({"role": "user", "content": line})
        text, ids = llm.engine.processor.render_chat(history)
        prompt = {"prompt": text, "prompt_token_ids": ids}
        reply = []
        try:
            for piece in stream_text(llm.engine, prompt, params):
                reply.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
        except ValueError as e:  # e.g. the conversation outgrew the context
            print(f"\n[error] {e}")
            history.pop()
            continue
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": "".join(reply)})
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="tokenmill", description="LLM inference platform")
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate a completion for one prompt (streams)")
    gen.add_argument("prompt")
    gen.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the chat template as a user turn"
    )
    add_engine_args(gen)
    add_sampling_args(gen, max_tokens=128)
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", help="interactive chat in the terminal (streams)")
    chat.add_argument("--system", default=None, help="system prompt")
    add_engine_args(chat)
    add_sampling_args(chat, max_tokens=512)
    chat.set_defaults(func=cmd_chat)

    from tokenmill.quant.cli import add_quant_parser
    from tokenmill.server.cli import add_serve_parser

    add_quant_parser(sub)
    from tokenmill.spec.cli import add_speculator_parser
    from tokenmill.tune.cli import add_tune_parser

    add_speculator_parser(sub)
    from tokenmill.model.tokenizer_export import add_tokenizer_parser

    add_tokenizer_parser(sub)

    add_serve_parser(sub, add_engine_args)
    from tokenmill.server.batch.offline import add_batch_parser

    add_batch_parser(sub, add_engine_args)
    from tokenmill.gateway.cli import add_gateway_parsers

    add_gateway_parsers(sub)
    try:
        from tokenmill.bench.cli import add_bench_parser
    except ImportError:  # the benchmark harness is optional
        pass
    else:
        add_bench_parser(sub)
        add_tune_parser(sub)
    try:
        from tokenmill.cluster.cli import add_cluster_parsers
        from tokenmill.router.cli import add_router_parsers
    except ImportError:  # the cluster layer is optional
        pass
    else:
        add_router_parsers(sub)
        add_cluster_parsers(sub, add_engine_args)
    for command in config_commands(parser).values():
        add_config_option(command)
    return parser


def config_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The commands `--config FILE` applies to: those without subcommands of their own."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: command
        for name, command in sub.choices.items()
        if not any(isinstance(a, argparse._SubParsersAction) for a in command._actions)
    }


def _command_index(argv: list[str]) -> int:
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "--log-level" else 1  # the only global option with a value
    return i


def command_of(argv: list[str]) -> str | None:
    """The subcommand named in `argv` (before parsing), or None."""
    i = _command_index(argv)
    return argv[i] if i < len(argv) else None


def cluster_subcommand(argv: list[str]) -> list[str]:
    """`cluster scale ...` is the `cluster-scale` command (`cluster` keeps `--config`)."""
    i = _command_index(argv)
    if argv[i : i + 2] == ["cluster", "scale"]:
        return [*argv[:i], "cluster-scale", *argv[i + 2 :]]
    return argv


def main(argv: list[str] | None = None) -> int:
    from tokenmill.engine.startup import StartupProfile

    profile = StartupProfile("api")  # from the moment the process was created
    profile.mark("interpreter")
    argv = cluster_subcommand(sys.argv[1:] if argv is None else list(argv))
    early = None
    if command_of(argv) == "serve" and threading.active_count() == 1 and sys.platform == "linux":
        from tokenmill.engine.core_entry import EarlyEngineCore

        early = EarlyEngineCore()  # imports torch while this process parses its arguments
    try:
        code = _run(argv, profile, early)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        return _pipe_closed()
    finally:
        if early is not None:
            early.cancel()  # unless `serve` handed it its arguments


def _pipe_closed() -> int:
    """The reader of stdout left (`tokenmill keys list | head`): exit quietly, as a command
    ended by SIGPIPE does. stdout goes to /dev/null, so that the interpreter's last flush of
    what is still buffered does not fail too (the Python docs' "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _run(argv: list[str], profile, early) -> int:
    parser = build_parser()
    try:
        argv = expand_config(argv, config_commands(parser))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args.startup_profile = profile
    args.early_engine_core = early
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
