"""EngineArgs is the one source of the engine's settings: `serve --help`'s options are the
keys `--config` accepts, every field has a flag and a config key that set it, and the
fields' defaults make EngineConfig's own."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import pytest

from tokenmill import envs
from tokenmill.cli import build_parser, config_commands
from tokenmill.config import EngineConfig
from tokenmill.config_file import expand_config, setting_keys
from tokenmill.engine.arg_spec import cli_fields, config_default
from tokenmill.engine.arg_utils import EngineArgs
from tokenmill.engine.llm import LLM

ENGINE_COMMANDS = ("serve", "generate", "chat", "batch", "cluster")


@pytest.fixture(autouse=True)
def no_kernel_variables(monkeypatch):
    for var in envs.VARIABLES:
        monkeypatch.delenv(var.name, raising=False)


def command(name: str) -> argparse.ArgumentParser:
    return config_commands(build_parser())[name]


def long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}


def test_serve_help_lists_exactly_the_keys_config_accepts():
    serve = command("serve")
    by_option, by_dest = setting_keys(serve)
    shown = long_options(serve) - {"--help", "--config"}
    assert {"--" + key for key in by_option} == shown
    text = serve.format_help()
    assert all(option in text for option in shown)
    # a dest key names the same setting as its option (`kv_cache_memory`, `warm_up`)
    assert all(by_option[key[2:]].dest in by_dest for key in shown)


def sample(field: dataclasses.Field, arg) -> Any:
    """A value of the field other than its default, as its flag parses it."""
    if arg.kind == "append":
        return ["name=/tmp/adapter"]
    if arg.kind != "value":
        return not field.default if field.default is not None else False
    if arg.choices:
        return next(c for c in arg.choices if c != field.default)
    if field.name == "int_dot_max_rows":
        return 96
    if "int" in str(field.type):
        return (field.default or 0) + 3
    if "float" in str(field.type):
        return (field.default or 0) + 0.25
    return f"/tmp/{field.name}"


def as_key(field: dataclasses.Field, arg, value: Any) -> dict[str, Any]:
    """The setting under its flag's name (`no-warm-up: true` for warm_up False)."""
    if arg.kind == "off":
        return {arg.flag[2:]: not value}
    return {arg.flag[2:]: value}


@pytest.mark.parametrize("name", ENGINE_COMMANDS)
def test_every_field_has_a_flag_and_a_config_key_that_set_it(name, tmp_path):
    parser = command(name)
    options = long_options(parser)
    for field, arg in cli_fields(EngineArgs):
        if arg.group == "prefill/decode disaggregation" and name != "serve":
            assert arg.flag not in options, (name, arg.flag)  # serve's alone
            continue
        assert arg.flag in options, (name, field.name)
        value = sample(field, arg)
        # under the flag's name and under its dest (`kv_cache_memory`, `warm_up`)
        for key in (as_key(field, arg, value), {arg.dest(field.name): value}):
            path = tmp_path / "c.json"
            path.write_text(json.dumps(key))
            top = build_parser()
            argv = [name, *required(name), "--config", str(path)]
            got = EngineArgs.from_cli_args(top.parse_args(expand_config(argv, {name: parser})))
            assert getattr(got, field.name) == value, (name, key)


def required(name: str) -> list[str]:
    return {"generate": ["hi"], "batch": ["in.jsonl", "out.jsonl"]}.get(name, [])


def test_the_fields_defaults_are_engine_configs_own():
    assert EngineArgs().create_engine_config() == EngineConfig()
    for field, arg in cli_fields(EngineArgs):
        if field.default is not None:
            assert arg.to_setting(field.default) == config_default(arg.target), field.name


def test_typed_flags_make_the_config_as_keywords_do():
    argv = ["serve", "--kv-cache-memory", "0.25", "--no-prefix-caching", "--no-int-dot",
            "--int-dot-max-rows", "any", "--role", "prefill", "--record-traffic-max-mib", "3"]  # fmt: skip
    args = EngineArgs.from_cli_args(build_parser().parse_args(argv))
    config = args.create_engine_config()
    assert config == EngineArgs(
        kv_cache_memory_gib=0.25, enable_prefix_caching=False, int_dot=False,
        int_dot_max_rows="any", kv_role="prefill", record_traffic_max_mib=3,
        scheduling_policy="priority",  # serve's default
    ).create_engine_config()  # fmt: skip
    assert config.cache_config.kv_cache_memory_bytes == 1 << 28
    assert config.record_traffic_max_bytes == 3 << 20
    assert config.scheduler_config.long_prefill_token_threshold == 256  # a prefill worker's
    assert (config.kernel_config.int_dot, config.kernel_config.int_dot_max_rows) == (False, "any")


def test_lora_flags_that_contradict_each_other_are_refused():
    def config(*flags: str) -> EngineConfig:
        argv = ["serve", *flags]
        return EngineArgs.from_cli_args(build_parser().parse_args(argv)).create_engine_config()

    assert config("--lora", "a=/p").enable_lora is False  # on through --lora
    assert config("--lora", "a=/p").lora_modules == ("a=/p",)
    assert config("--enable-lora").enable_lora is True
    assert config("--no-enable-lora").enable_lora is False
    with pytest.raises(ValueError, match="--no-enable-lora turns LoRA off, and --lora needs it"):
        config("--lora", "a=/p", "--no-enable-lora")


def test_llm_takes_the_fields_as_keywords():
    with pytest.raises(TypeError, match="not_a_setting"):
        LLM(not_a_setting=1)
    with pytest.raises(ValueError, match="int_dot_max_rows"):
        EngineArgs(int_dot_max_rows=0).create_engine_config()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--int-dot-max-rows", "many"])
