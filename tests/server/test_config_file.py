"""`--config FILE`: a command's flags from YAML / JSON / TOML, checked as typed flags are,
typed flags winning."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import start_server
from tokenmill.cli import build_parser, config_commands, main
from tokenmill.config_file import MAX_CONFIG_BYTES, expand_config, load_config_file

SETTINGS = {
    "max-num-seqs": 7,
    "served_model_name": ["foo", "bar"],
    "no-warm-up": True,
    "kv_cache_memory": 0.25,
    "no_prefix_caching": True,
    "port": 8123,
}
SAME_AS_TYPED = [
    "serve", "--max-num-seqs", "7", "--served-model-name", "foo", "--served-model-name", "bar",
    "--no-warm-up", "--kv-cache-memory", "0.25", "--no-prefix-caching", "--port", "8123",
]  # fmt: skip


def write(tmp_path, suffix: str, values: dict) -> str:
    path = tmp_path / f"config{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(values))
    elif suffix == ".toml":
        path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    else:
        import yaml

        path.write_text(yaml.safe_dump(values))
    return str(path)


def parse(argv: list[str]):
    parser = build_parser()
    return parser.parse_args(expand_config(argv, config_commands(parser)))


def comparable(args) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("config", "func")}


@pytest.mark.parametrize("suffix", [".yaml", ".json", ".toml"])
def test_a_config_file_equals_the_same_flags_typed(tmp_path, suffix):
    path = write(tmp_path, suffix, SETTINGS)
    from_file = parse(["serve", "--config", path])
    typed = build_parser().parse_args(SAME_AS_TYPED)
    assert comparable(from_file) == comparable(typed)
    assert from_file.warm_up is False and from_file.served_model_name == ["foo", "bar"]


def test_typed_flags_win_lists_and_switches_included(tmp_path):
    path = write(tmp_path, ".yaml", SETTINGS)
    args = parse(
        ["--log-level", "info", "serve", "--config", path, "--port", "9000",
         "--served-model-name", "baz", "--max-num-seqs=3"]
    )  # fmt: skip
    assert (args.port, args.served_model_name, args.max_num_seqs) == (9000, ["baz"], 3)
    assert args.kv_cache_memory == 0.25 and args.log_level == "info"
    # `warm_up: true` under its dest name leaves the switch off (the default)
    assert parse(["serve", "--config", write(tmp_path, ".json", {"warm_up": True})]).warm_up


@pytest.mark.parametrize(
    "values, message",
    [
        ({"max-num-seqs-typo": 3}, "unknown setting 'max-num-seqs-typo'"),
        ({"config": "other.yaml"}, "unknown setting 'config'"),
        ({"no-warm-up": "yes"}, "expected true or false"),
        ({"port": {"nested": 1}}, "expected a number or a string"),
        ({"port": True}, "expected a number or a string"),
    ],
)
def test_bad_settings_are_clear_errors(tmp_path, capsys, values, message):
    path = write(tmp_path, ".json", values)
    assert main(["serve", "--config", path]) == 2
    assert message in capsys.readouterr().err


def test_bad_files_are_clear_errors(tmp_path, capsys):
    cases = {
        "missing.yaml": (None, "cannot read"),
        "list.yaml": ("- a\n- b\n", "must hold a mapping"),
        "broken.json": ("{", "does not parse"),
        "broken.toml": ("a = ", "does not parse"),
        "broken.yaml": ("a: [1,\n", "broken.yaml, line 2, column 1: expected"),
        "config.ini": ("a=1", "expected a .yaml"),
        "big.yaml": ("#" * (MAX_CONFIG_BYTES + 1), "bytes (at most"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        assert main(["serve", "--config", str(path)]) == 2, name
        assert message in capsys.readouterr().err, name
    # a value argparse refuses is its usual error (exit status 2)
    with pytest.raises(SystemExit) as e:
        main(["serve", "--config", write(tmp_path, ".json", {"max-num-seqs": "many"})])
    assert e.value.code == 2


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "max-num-seqs: 3\nport: 80: 81\n",
            "line 2, column 9: mapping values are not allowed here",
        ),
        ("a: [1,\n", "line 2, column 1: expected the node content, but found '<stream end>'"),
    ],
)
def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path, text, where):
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_config_file(path)
    assert str(err.value) == f"config: {path}, {where}"


def test_serve_runs_with_a_config_file(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(
        "served-model-name: [house-model]\nmax-num-seqs: 3\ndefault-max-tokens: 5\n"
        "max-num-batched-tokens: 640\nblock-size: 32\nno-prefix-caching: true\n"
    )
    server = start_server(tmp_path, "--config", str(path), "--api-key", "k" * 32)
    auth = {"Authorization": "Bearer " + "k" * 32}
    try:
        # /server_info reports every setting in force: the file's, the defaults, no secret
        info = httpx.get(f"{server.base_url}/server_info", headers=auth, timeout=10).json()
        engine, settings = info["config"]["engine"], info["config"]["server"]
        assert engine["scheduler_config"]["max_num_seqs"] == 3
        assert engine["scheduler_config"]["max_num_batched_tokens"] == 640
        assert engine["scheduler_config"]["policy"] == "priority"  # serve's default, shown too
        assert engine["cache_config"]["block_size"] == 32
        assert engine["cache_config"]["enable_prefix_caching"] is False
        assert engine["model_config"]["plan"]["scheme"] == "native"
        # the kernel switches in force, the integer-dot row limit as measured for this machine
        assert engine["kernel_config"]["int_dot_max_rows"] is not None
        assert settings["default_max_tokens"] == 5 and settings["api_key"] == "set"
        assert "k" * 32 not in json.dumps(info)
        models = httpx.get(f"{server.v1}/models", headers=auth, timeout=10).json()["data"]
        assert [m["id"] for m in models] == ["house-model"]
        r = httpx.post(
            f"{server.v1}/chat/completions",
            json={"model": "house-model", "messages": [{"role": "user", "content": "Hi"}]},
            headers=auth,
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 5
    finally:
        assert server.stop() == 0


def test_server_info_shows_the_kernel_switches_in_force(tmp_path, monkeypatch):
    """A variable, a flag and a config key each set a switch; /server_info shows them all,
    the integer-dot row limit as the engine core resolved it."""
    monkeypatch.setenv("TOKENMILL_GREEDY_ARGMAX", "0")
    monkeypatch.setenv("TOKENMILL_INT_DOT_MAX_ROWS", "48")
    path = tmp_path / "serve.yaml"
    path.write_text("prefetch: false\nno-warm-up: true\n")
    server = start_server(tmp_path, "--config", str(path), "--no-fused-decode")
    try:
        info = httpx.get(f"{server.base_url}/server_info", timeout=10).json()
    finally:
        assert server.stop() == 0
    kernels = info["config"]["engine"]["kernel_config"]
    assert kernels == {
        "int_dot": True, "int_dot_max_rows": 48, "int_dot_activation_bits": 16,
        "greedy_argmax": False, "fused_decode": False, "prefetch": False,
    }  # fmt: skip
    facts = info["engine"]["kernels"]
    assert {k: facts[k] for k in kernels} == kernels
    assert isinstance(facts["native_kernels"], bool)
