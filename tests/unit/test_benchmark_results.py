"""benchmarks/results.py: the dated results file every benchmark script leaves behind."""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import sys
from pathlib import Path

import pytest

from benchmarks import results

REPO = Path(__file__).resolve().parents[2]
FACTS = {
    "cpu": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
    "cpu_id": "family 6, model 143",
    "cpu_flags": ["avx2", "avx512_vnni", "amx_int8"],
    "cores": 2,
    "memory_gib": 7.8,
    "l3": "105 MiB",
    "os": "Linux 6.1",
    "python": "3.11.9",
    "tokenmill": "0.1.0",
    "commit": "abc1234",
    "load_average": (0.5, 0.4, 0.3),
}
WHEN = dt.datetime(2026, 12, 4, 11, 0, tzinfo=dt.UTC)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--rounds", type=int, default=3)
    results.add_arguments(p)
    return p.parse_args(argv)


def test_a_plain_run_writes_a_dated_file_with_machine_command_and_table(tmp_path):
    args = parse(["--rounds", "2", "--results-dir", str(tmp_path)])
    table = results.markdown_table(["system", "tok/s"], [["tokenmill", "232.0"]])
    argv = [str(REPO / "benchmarks" / "throughput.py"), "--rounds", "2"]
    path = results.write(
        "throughput", table, args, argv=argv, when=WHEN, facts=FACTS, notes=["Median of 3."]
    )
    assert path == tmp_path / "2026-12-04-throughput-intel-xeon-platinum-8481c.md"
    text = path.read_text()
    assert text.startswith("# throughput\n")
    assert "- **date**: 2026-12-04 11:00 UTC" in text
    assert (
        "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz (family 6, model 143), 2 cores, 8 GiB, "
        "L3 105 MiB" in text
    )
    assert "- **CPU flags**: avx2, avx512_vnni, amx_int8" in text
    assert "tokenmill 0.1.0 (commit abc1234)" in text
    # the command as typed from the repository root, script path relative
    assert "```bash\n" in text and " benchmarks/throughput.py --rounds 2\n```" in text
    assert "| system | tok/s |\n| --- | ---: |\n| tokenmill | 232.0 |" in text
    assert text.rstrip().endswith("Median of 3.")


def test_a_second_run_the_same_day_gets_its_own_file(tmp_path):
    args = parse(["--results-dir", str(tmp_path)])
    first = results.write("cold-start", "a", args, argv=["x.py"], when=WHEN, facts=FACTS)
    second = results.write("cold-start", "b", args, argv=["x.py"], when=WHEN, facts=FACTS)
    assert first != second and second.name.endswith("-2.md")
    assert "a" in first.read_text() and "b" in second.read_text()


def test_no_results_writes_nothing(tmp_path):
    args = parse(["--no-results", "--results-dir", str(tmp_path)])
    assert results.write("x", "table", args, argv=["x.py"], facts=FACTS) is None
    with results.capture("x", args):
        print("a table")
    assert list(tmp_path.iterdir()) == []


def test_the_default_directory_is_benchmarks_results():
    assert parse([]).results_dir == REPO / "benchmarks" / "results"


def test_capture_keeps_the_printed_table_and_still_prints_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["benchmarks/loop_cutoff.py"])
    monkeypatch.setattr(results, "machine_facts", lambda: FACTS)
    args = parse(["--results-dir", str(tmp_path)])
    with results.capture("loop-cutoff", args):
        print("\x1b[1msetting\x1b[0m   cut after")
        print("(32, 4, 48)    48   ")
    assert "cut after" in capsys.readouterr().out  # the console still gets it
    (path,) = tmp_path.iterdir()
    assert "```text\nsetting   cut after\n(32, 4, 48)    48\n```" in path.read_text()


def test_capture_writes_nothing_when_the_run_fails(tmp_path):
    args = parse(["--results-dir", str(tmp_path)])
    with pytest.raises(RuntimeError), results.capture("x", args):
        print("half a table")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_the_kernel_switches_a_run_gets_are_in_its_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMILL_INT_DOT", "0")
    monkeypatch.delenv("TOKENMILL_INT_DOT_MAX_ROWS", raising=False)
    kernels = results.machine_facts()["kernels"]
    assert kernels["int_dot"] is False and kernels["int_dot_max_rows"] is None
    args = parse(["--results-dir", str(tmp_path)])
    path = results.write(
        "throughput", "t", args, argv=["x.py"], when=WHEN, facts={**FACTS, "kernels": kernels}
    )
    assert "- **kernel switches**: int_dot off, int_dot_max_rows measured," in path.read_text()


def test_machine_facts_come_from_this_machine():
    facts = results.machine_facts()
    assert facts["cpu"] and facts["cores"] >= 1
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    family = next((ln.split(":")[1].strip() for ln in lines if ln.startswith("cpu family")), None)
    if family is not None:  # x86 Linux: the generation's numbers, as cpuinfo has them
        assert facts["cpu_id"].startswith(f"family {family}, model ")
    assert set(facts["cpu_flags"]) <= set(results.KERNEL_FLAGS)
    assert results.slug(facts["cpu"])


@pytest.mark.parametrize(
    ("cpu", "slug"),
    [
        ("AMD EPYC", "amd-epyc"),
        ("AMD EPYC 9B14 96-Core Processor", "amd-epyc-9b14"),
        ("Intel(R) Xeon(R) CPU @ 2.20GHz", "intel-xeon"),
        ("", "unknown-cpu"),
    ],
)
def test_file_names_carry_a_short_cpu_name(cpu, slug):
    assert results.slug(cpu) == slug


SCRIPTS = sorted(
    p for p in (REPO / "benchmarks").glob("*.py") if p.name not in ("__init__.py", "results.py")
)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_script_leaves_a_results_file(script):
    """Each script offers --results-dir / --no-results and writes through the helper."""
    tree = ast.parse(script.read_text())
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "results_file.add_arguments" in calls, script.name
    assert calls & {"results_file.write", "results_file.capture"}, script.name
