"""`tokenmill cluster` (N replicas, or prefill and decode workers, on this machine or on a
Ray cluster, with the router in front) and `tokenmill cluster scale`."""

from __future__ import annotations

import argparse
import logging
import secrets
import shlex
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tokenmill.ports import add_port_range_option
from tokenmill.router.cli import add_router_args, router_config, run_router

if TYPE_CHECKING:
    from tokenmill.cluster.ray_config import RayConfig

# engine flags the cluster sets itself for each replica
_CLUSTER_OWNED = {"kv_events_endpoint", "kv_events_replay_endpoint", "num_threads"}


def add_cluster_parsers(sub, add_engine_args) -> None:
    c = sub.add_parser("cluster", help="N engine replicas on this machine + the router in front")
    c.add_argument("--replicas", type=int, default=2)
    c.add_argument(
        "--prefill",
        type=int,
        default=0,
        metavar="N",
        help="prefill workers (with --decode: a disaggregated layout instead of --replicas)",
    )
    c.add_argument("--decode", type=int, default=0, metavar="M", help="decode workers")
    c.add_argument("--replica-args", default="", help="extra `serve` flags for every replica")
    c.add_argument("--prefill-args", default="", help="extra `serve` flags for prefill workers")
    c.add_argument(
        "--decode-args", default="",
        help="extra `serve` flags for decode workers (e.g. a small --max-num-batched-tokens: "
        "their streams then wait for at most that much prefill per step)",
    )  # fmt: skip
    c.add_argument("--log-dir", default=None, help="replica logs (default: a temp folder)")
    add_port_range_option(c, "replicas (HTTP, KV events, replay: 3 each)")
    add_ray_args(c)
    add_router_args(c)
    before = list(c._actions)
    add_engine_args(c)
    c.set_defaults(func=cmd_cluster, _engine_actions=[a for a in c._actions if a not in before])

    # `tokenmill cluster scale ...` (tokenmill/cli.py maps it here: a subcommand of `cluster`
    # would take `--config` from it)
    s = sub.add_parser("cluster-scale", help="scale a running `tokenmill cluster`")
    s.add_argument("--url", default="http://127.0.0.1:8000", help="the cluster's router")
    s.add_argument("--replicas", type=int, default=None, metavar="N")
    s.add_argument("--prefill", type=int, default=None, metavar="N")
    s.add_argument("--decode", type=int, default=None, metavar="M")
    s.add_argument("--api-key", default=None, help="the router's key (also $TOKENMILL_API_KEY)")
    s.add_argument("--api-key-file", default=None, metavar="PATH")
    s.add_argument("--timeout", type=float, default=900.0, metavar="S")
    s.set_defaults(func=cmd_cluster_scale)



def add_ray_args(c: argparse.ArgumentParser) -> None:
    from tokenmill.cluster.ray_config import STRATEGIES, RayConfig

    d, r = RayConfig(), c.add_argument_group("Ray (pip install 'tokenmill[ray]')")
    r.add_argument(
        "--ray", default=None, metavar="ADDRESS",
        help="workers as Ray actors on the Ray cluster at ADDRESS (HOST:6379, ray://HOST:10001),"
        " or 'auto': a local head started and stopped with this command",
    )  # fmt: skip
    r.add_argument("--ray-strategy", choices=STRATEGIES, default=d.strategy,
                   help="placement group strategy over the workers started together")  # fmt: skip
    r.add_argument("--ray-memory", type=float, default=d.memory_gb, metavar="GIB",
                   help="Ray memory resource requested per worker")  # fmt: skip
    r.add_argument("--ray-gpus", type=float, default=d.gpus, metavar="N",
                   help="GPUs per worker (default: 1 when the cluster has GPUs, else 0)")  # fmt: skip
    r.add_argument("--ray-max-restarts", type=int, default=d.max_restarts, metavar="N",
                   help="Ray restarts a failed worker at most N times (-1: always)")  # fmt: skip
    r.add_argument("--ray-placement-timeout", type=float, default=d.placement_timeout_s,
                   metavar="S")  # fmt: skip


def ray_config(args: argparse.Namespace) -> RayConfig:
    from tokenmill.cluster.ray_config import RayConfig

    return RayConfig(
        address=args.ray, strategy=args.ray_strategy, memory_gb=args.ray_memory,
        gpus=args.ray_gpus, max_restarts=args.ray_max_restarts,
        placement_timeout_s=args.ray_placement_timeout,
    )  # fmt: skip


def ray_worker_host(ray: RayConfig, host: str) -> str | None:
    """Where Ray workers bind: on a cluster of this machine alone (`--ray auto`), the
    router's own --host (a wildcard: this node's address); on a multi-node cluster, each
    node's address (None), which other nodes reach."""
    from tokenmill.cluster.ray_config import AUTO

    if ray.address != AUTO or host in ("0.0.0.0", "::", ""):
        return None
    return host


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine flags given to `cluster`, as `serve` flags for each replica."""
    out: list[str] = []
    for a in args._engine_actions:
        value = getattr(args, a.dest)
        if a.dest in _CLUSTER_OWNED or value == a.default or not a.option_strings:
            continue
        if isinstance(a, argparse.BooleanOptionalAction):  # --thing / --no-thing
            out.append(a.option_strings[0 if value else 1])
        elif a.nargs == 0:
            out.append(a.option_strings[0])
        else:
            out += [a.option_strings[0], str(value)]
    return out


def cluster_roles(replicas: int, prefill: int, decode: int) -> list[str]:
    """Each replica's --role: N plain replicas, or prefill + decode workers."""
    if prefill < 0 or decode < 0:
        raise ValueError("prefill, decode: must be >= 0")
    if not prefill and not decode:
        return ["both"] * replicas
    if not prefill or not decode:
        raise ValueError("a disaggregated cluster needs --prefill N and --decode M, both >= 1")
    return ["prefill"] * prefill + ["decode"] * decode


def cmd_cluster(args: argparse.Namespace) -> int:
    from tokenmill.cluster import routes as cluster_routes
    from tokenmill.cluster.launcher import Launcher, WorkerRequest
    from tokenmill.cluster.manager import ClusterManager
    from tokenmill.ports import PortPool
    from tokenmill.router.auth import resolve_api_key
    from tokenmill.router.cluster import threads_per_replica

    if args.replicas < 1:
        raise ValueError("replicas: must be >= 1")
    roles = cluster_roles(args.replicas, args.prefill, args.decode)
    config = router_config(args)  # validate before starting anything
    ray = ray_config(args) if args.ray else None
    if ray is not None and args.port_range is not None:
        raise ValueError("--port-range: local replicas only (Ray workers bind free ports)")
    if args.gateway_config is not None:
        from tokenmill.gateway.config import load_gateway_config

        load_gateway_config(args.gateway_config)
    api_key = resolve_api_key(args.api_key, args.api_key_file)
    # the replicas always require a key, which the router presents: theirs are reached only
    # through the router (and its gateway), never around it
    replica_key = api_key or secrets.token_urlsafe(32)
    argv = engine_argv(args) + shlex.split(args.replica_args)
    level = logging.getLevelName(logging.getLogger().level)
    role_argv = {"prefill": shlex.split(args.prefill_args), "decode": shlex.split(args.decode_args)}
    launcher: Launcher
    if ray is not None:
        from tokenmill.cluster.ray_launcher import RayLauncher

        threads = args.num_threads or (threads_per_replica(len(roles)) if ray.address == "auto"
                                       else 1)  # fmt: skip
        print(f"connecting to Ray ({ray.address}) ...", flush=True)
        launcher = RayLauncher(ray, level, replica_key, host=ray_worker_host(ray, args.host))
        where = f"Ray actors, {threads} CPU(s) each"
    else:
        from tokenmill.cluster.local import LocalLauncher

        threads = args.num_threads or threads_per_replica(len(roles))
        log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tokenmill-cluster-"))
        ports = PortPool(args.port_range, exclude=[args.port])  # the router binds --port
        launcher = LocalLauncher(log_dir, log_level=level, api_key=replica_key, ports=ports)
        where = f"logs in {log_dir}"

    def request_for(role: str) -> WorkerRequest:
        return WorkerRequest(role, tuple(argv + role_argv.get(role, [])), threads)

    manager = ClusterManager(launcher, request_for)
    print(f"starting {len(roles)} replicas ({where}) ...", flush=True)
    specs = manager.start([request_for(role) for role in roles])
    for w, spec in zip(manager.workers, specs, strict=True):
        node = manager.states[w.id].node
        print(f"  {w.request.role:7} {spec.url}  events {spec.events}  replay {spec.replay}"
              f"{'  node ' + node if ray else ''}")  # fmt: skip
    try:
        return run_router(
            config, specs, args.model, args.host, args.port, args.log_decisions, api_key,
            args.protect_metrics, args.gateway_config, cluster=manager, replica_key=replica_key,
            extra_routes=[cluster_routes.router],
        )  # fmt: skip
    finally:
        codes = manager.stop_all()
        print(f"replicas stopped (exit codes {codes})", flush=True)


def cmd_cluster_scale(args: argparse.Namespace) -> int:
    import httpx

    from tokenmill.router.auth import resolve_api_key

    body = {k: getattr(args, k) for k in ("replicas", "prefill", "decode")}
    body = {k: v for k, v in body.items() if v is not None}
    if not body:
        raise ValueError("scale: give --replicas N, or --prefill N / --decode M")
    key = resolve_api_key(args.api_key, args.api_key_file)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(args.url.rstrip("/") + "/cluster/scale", json=body, headers=headers,
                   timeout=args.timeout)  # fmt: skip
    if r.status_code != 200:
        print(f"error: {r.status_code} {r.text}", file=sys.stderr)
        return 1
    for w in r.json()["workers"]:
        print(f"  {w['role']:7} {w['status']:10} {w['url'] or '-'}  node {w['node'] or '-'}"
              f"  restarts {w['restarts']}")  # fmt: skip
    return 0
