"""`--port-range LO-HI` of `cluster`, `tune` and `bench --compare`: checked like any flag, and
the servers those commands start listen on free ports inside the range."""

from __future__ import annotations

import argparse
import socket
import sys

import httpx
import pytest

from tokenmill.bench.peers import ManagedServer, ServerSpec
from tokenmill.cli import build_parser, main
from tokenmill.ports import NoFreePort, PortPool, PortRange, free_port, parse_port_range
from tokenmill.router import cluster

COMMANDS = [["cluster"], ["tune"], ["bench", "--compare"]]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def free_range(n: int) -> PortRange:
    """n consecutive ports, free now."""
    for _ in range(50):
        low = free_port()
        if low + n - 1 <= 65535 and all(_free(p) for p in range(low, low + n)):
            return PortRange(low, low + n - 1)
    raise RuntimeError("no free block of ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_range_is_two_ports_in_order():
    assert parse_port_range("8000-8010") == PortRange(8000, 8010)
    assert parse_port_range("1-65535") == PortRange(1, 65535)
    assert str(parse_port_range("9000-9000")) == "9000-9000"
    for bad in ("8000", "8000-", "a-b", "8000-80x", "9000-8000", "0-10", "1-65536", "-5-10", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_port_range(bad)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("bad", ["9000-8000", "9000", "1-70000", "x-y"])
def test_a_bad_range_exits_2_naming_the_flag(command, bad, capsys):
    assert build_parser().parse_args([*command, "--port-range", "9000-9010"]).port_range == (
        PortRange(9000, 9010)
    )
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*command, "--port-range", bad])
    assert exit_.value.code == 2
    assert "argument --port-range: expected" in capsys.readouterr().err


def test_bench_takes_a_range_only_for_the_servers_it_starts(capsys):
    assert main(["bench", "--port-range", "9000-9010"]) == 2
    assert "--port-range: for the servers --compare starts" in capsys.readouterr().err


def test_the_pool_hands_out_free_ports_of_the_range_once():
    r, clock = free_range(5), Clock()
    pool = PortPool(r, exclude=[r.low + 1], hold_s=60, clock=clock)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", r.low + 2))
        busy.listen()
        assert [pool.take(), pool.take(), pool.take()] == [r.low, r.low + 3, r.low + 4]
        with pytest.raises(NoFreePort, match=f"--port-range {r}: no free port left"):
            pool.take()
        clock.t += 61  # long after: their servers bound them, or never came
        assert pool.take() == r.low
    anywhere = PortPool()  # without a range: any free ports, never one twice
    assert len({anywhere.take() for _ in range(5)}) == 5


def test_replicas_take_their_three_ports_from_the_range(tmp_path, monkeypatch):
    commands = []

    class Popen:
        def __init__(self, cmd, **kwargs) -> None:
            commands.append(cmd)

    monkeypatch.setattr(cluster.subprocess, "Popen", Popen)
    r = free_range(8)
    pool = PortPool(r, exclude=[r.low])  # the router's own port
    specs = [cluster.start_replica([], tmp_path, 1, ports=pool).spec for _ in range(2)]
    ports = [int(u.rsplit(":", 1)[1]) for s in specs for u in (s.url, s.events, s.replay)]
    assert ports == list(range(r.low + 1, r.low + 7))
    assert commands[0][commands[0].index("--port") + 1] == str(r.low + 1)


def test_cluster_gives_its_launcher_a_pool_of_the_range_without_the_router_port(monkeypatch):
    import tokenmill.cluster.local as local

    seen = []

    class Launcher:
        def __init__(self, *args, ports: PortPool, **kwargs) -> None:
            seen.append(ports)

        def start_many(self, requests):
            raise RuntimeError("stop here")

        def close(self) -> None:
            pass

    monkeypatch.setattr(local, "LocalLauncher", Launcher)
    with pytest.raises(RuntimeError, match="stop here"):
        main(["cluster", "--replicas", "1", "--port", "9005", "--port-range", "9000-9010"])
    [pool] = seen
    assert pool.port_range == PortRange(9000, 9010) and pool.exclude == {9005}


def test_cluster_refuses_a_range_for_ray_workers(capsys):
    assert main(["cluster", "--ray", "auto", "--port-range", "9000-9010"]) == 2
    assert "--port-range: local replicas only" in capsys.readouterr().err


def test_a_started_server_listens_on_a_port_of_the_range(tmp_path):
    r = free_range(3)
    spec = ServerSpec(
        "http", (sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"), "/"
    )
    with ManagedServer(spec, tmp_path, PortPool(r)) as server:
        assert r.low <= server.port <= r.high
        assert httpx.get(server.base_url + "/", timeout=10).status_code == 200


def test_tune_trials_use_the_range_and_pass_it_to_a_cluster(tmp_path):
    from tokenmill.tune.runner import TrialRunner

    r = PortRange(9000, 9010)
    runner = TrialRunner(None, None, None, tmp_path, None, port_range=r)  # type: ignore[arg-type]
    assert runner.ports.port_range == r and runner.ports is runner.ports
    cluster_argv = runner.server({"replicas": 2}).argv
    assert cluster_argv[cluster_argv.index("--port-range") + 1] == "9000-9010"
    assert "--port-range" not in runner.server({}).argv  # `serve` binds the port it is given
