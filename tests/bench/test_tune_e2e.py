"""`tokenmill tune` end to end on the embedded model with a tiny search space: trials,
frontier report, the chosen configuration as a config file that `serve --config` loads,
and a second invocation that resumes without measuring anything again."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.server.conftest import start_server
from tokenmill.config_file import load_config_file
from tokenmill.tune.trials import TrialStore


def tune(out, space, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "tokenmill.cli", "tune", "--space", str(space),
        "--concurrency", "4", "--num-requests", "8", "--input-len", "32", "--output-len", "16",
        "--slo", "ttft=20s", "--budget-minutes", "10", "--repeat-chosen", "1",
        "--serve-args", "--kv-cache-memory 0.25", "--output-dir", str(out), "--no-progress",
        *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_tune_measures_picks_writes_a_config_and_resumes(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("max-num-seqs: [1, 8]\n")
    out = tmp_path / "tune"
    done = tune(out, space)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trials = TrialStore(out / "trials.jsonl").trials
    configs = [t.config for t in trials]
    # the defaults, both grid points, then more runs of the chosen configuration (and of
    # another one if the chosen one's median fell behind it) and as many of the defaults
    assert configs[:3] == [{}, {"max-num-seqs": 1}, {"max-num-seqs": 8}]
    assert 4 <= len(trials) <= 7 and all(c in configs[:3] for c in configs[3:])
    assert configs.count({}) == 2
    for t in trials:
        assert t.total > 0 and t.per_user > 0 and t.slo_attainment == 1.0
        assert t.figures["completed"] == 8 and t.figures["failed"] == 0
        assert t.background_cores is not None
    # one user at a time: the most per-user throughput, the least in total
    one, eight = trials[1], trials[2]
    assert one.total < eight.total
    report = (out / "report.html").read_text()
    assert "Chosen:" in report and "Run-to-run spread" in report and "--max-num-seqs 8" in report
    assert (out / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    best = load_config_file(out / "best.yaml")
    assert best["kv-cache-memory"] == 0.25
    server = start_server(tmp_path, "--config", str(out / "best.yaml"))
    try:
        assert httpx.get(f"{server.v1}/models", timeout=10).status_code == 200
    finally:
        assert server.stop() == 0
    again = tune(out, space)
    assert again.returncode == 0, again.stdout[-3000:]
    assert f"resuming: {len(trials)} trials" in again.stdout
    assert len(TrialStore(out / "trials.jsonl").trials) == len(trials)  # nothing measured again


@pytest.mark.slow  # two replicas and a router per trial
def test_tune_over_replicas_writes_a_cluster_config(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("replicas: [1, 2]\n")
    out = tmp_path / "tune"
    done = tune(out, space, "--max-trials", "3", "--repeat-chosen", "0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    configs = [t.config for t in TrialStore(out / "trials.jsonl").trials]
    assert {"replicas": 2} in configs and {"replicas": 1} in configs
    two = next(t for t in TrialStore(out / "trials.jsonl").trials if t.config == {"replicas": 2})
    assert two.figures["completed"] == 8 and two.total > 0  # served through the router
    best = load_config_file(out / "best.yaml")
    command = "cluster" if best.get("replicas", 1) > 1 else "serve"
    assert f"tokenmill {command} --config" in (out / "best.yaml").read_text()
    assert f"tokenmill {command} --config" in (out / "report.html").read_text()
