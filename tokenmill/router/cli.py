"""`tokenmill router` and `tokenmill cluster`."""

from __future__ import annotations

import argparse
import logging
import secrets
import shlex
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tokenmill.ports import add_port_range_option
from tokenmill.router.config import POLICIES, CostWeights, GuardConfig, RouterConfig
from tokenmill.router.disagg import DISAGG_MODES, DisaggConfig
from tokenmill.router.replicas import ReplicaSpec

if TYPE_CHECKING:
    from tokenmill.cluster.manager import ClusterManager
    from tokenmill.cluster.ray_config import RayConfig

logger = logging.getLogger("tokenmill.router")

# engine flags the cluster sets itself for each replica
_CLUSTER_OWNED = {"kv_events_endpoint", "kv_events_replay_endpoint", "num_threads"}


def add_router_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    a = p.add_argument_group("API key (also $TOKENMILL_API_KEY)")
    a.add_argument(
        "--api-key", default=None,
        help="require 'Authorization: Bearer KEY' (visible in ps: prefer the file or the env)",
    )  # fmt: skip
    a.add_argument("--api-key-file", default=None, metavar="PATH", help="read the key from PATH")
    a.add_argument("--protect-metrics", action="store_true", help="/metrics needs the key too")
    a.add_argument(
        "--gateway-config", default=None, metavar="FILE",
        help="the gateway in front of the router: API keys, limits, ledger, guardrails, tool "
        "policy (clients then use gateway keys; --api-key stays the replicas' key)",
    )  # fmt: skip
    g = p.add_argument_group("routing")
    g.add_argument("--policy", choices=POLICIES, default="cache_aware")
    w, gd = CostWeights(), GuardConfig()
    g.add_argument("--prefill-weight", type=float, default=w.prefill, help="cost per prefill block")
    g.add_argument(
        "--decode-weight", type=float, default=w.decode, help="cost per active (decode) block"
    )
    g.add_argument("--host-credit", type=float, default=w.host_credit)
    g.add_argument("--disk-credit", type=float, default=w.disk_credit)
    g.add_argument(
        "--balance-abs-threshold", type=int, default=gd.abs_threshold,
        help="imbalance guard: max - min requests in flight above this ...",
    )  # fmt: skip
    g.add_argument(
        "--balance-rel-threshold", type=float, default=gd.rel_threshold,
        help="... and max > this x min: route to the least loaded",
    )  # fmt: skip
    c = RouterConfig()
    g.add_argument("--booking-ttl", type=float, default=c.booking_ttl_s, metavar="S")
    g.add_argument("--approx-ttl", type=float, default=c.approx_ttl_s, metavar="S")
    g.add_argument("--health-interval", type=float, default=c.health_interval_s, metavar="S")
    g.add_argument("--retries", type=int, default=c.retries, help="before the first token")
    g.add_argument("--max-in-flight", type=int, default=c.max_in_flight)
    g.add_argument("--max-queue", type=int, default=c.max_queue, help="beyond this: 503")
    g.add_argument(
        "--log-decisions", action="store_true", help="one JSON line per routing decision"
    )
    d, pd = DisaggConfig(), p.add_argument_group("prefill/decode disaggregation")
    pd.add_argument(
        "--pd-mode", choices=DISAGG_MODES, default=d.mode,
        help="with prefill workers: conditional (remote prefill when the prompt part the decode "
        "worker lacks is long and the prefill pool is not saturated), always, or never",
    )  # fmt: skip
    pd.add_argument(
        "--pd-min-uncached-tokens",
        type=int,
        default=d.min_uncached_tokens,
        metavar="N",
        help="conditional: remote prefill from this many uncached tokens",
    )
    pd.add_argument(
        "--pd-max-prefill-in-flight",
        type=int,
        default=d.max_prefill_in_flight,
        metavar="N",
        help="a prefill worker with this many requests is saturated",
    )
    pd.add_argument(
        "--pd-max-prefill-queue-tokens", type=int, default=d.max_prefill_queue_tokens,
        metavar="N", help="... or when the prompt would wait for this many booked prompt "
        "tokens (each up to the prompt's length on a worker that shares its steps between "
        "prompts); then the decode worker prefills it",
    )  # fmt: skip


def router_config(args: argparse.Namespace) -> RouterConfig:
    return RouterConfig(
        policy=args.policy,
        weights=CostWeights(
            prefill=args.prefill_weight,
            decode=args.decode_weight,
            host_credit=args.host_credit,
            disk_credit=args.disk_credit,
        ),
        guard=GuardConfig(args.balance_abs_threshold, args.balance_rel_threshold),
        booking_ttl_s=args.booking_ttl,
        approx_ttl_s=args.approx_ttl,
        health_interval_s=args.health_interval,
        retries=args.retries,
        max_in_flight=args.max_in_flight,
        max_queue=args.max_queue,
        disagg=DisaggConfig(
            args.pd_mode,
            args.pd_min_uncached_tokens,
            args.pd_max_prefill_in_flight,
            args.pd_max_prefill_queue_tokens,
        ),  # fmt: skip
    )


def add_router_parsers(sub, add_engine_args) -> None:
    p = sub.add_parser("router", help="cache-aware router in front of running replicas")
    p.add_argument(
        "--replica", action="append", required=True, metavar="URL[,EVENTS[,REPLAY]]",
        help="a replica, with its KV event and replay endpoints (repeatable)",
    )  # fmt: skip
    p.add_argument("--model", default=None, help="tokenizer/chat template (default: embedded)")
    add_router_args(p)
    p.set_defaults(func=cmd_router)

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


def run_router(config: RouterConfig, specs: list[ReplicaSpec], model: str | None, host: str,
               port: int, log_decisions: bool = False, api_key: str | None = None,
               protect_metrics: bool = False, gateway_config: str | None = None,
               cluster: ClusterManager | None = None,
               replica_key: str | None = None) -> int:  # fmt: skip
    import asyncio

    import uvicorn

    from tokenmill.router.app import build_router_app
    from tokenmill.router.prompts import PromptHasher
    from tokenmill.router.router import Router
    from tokenmill.server.http_protocol import envelope_protocol

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request
    if log_decisions:
        logging.getLogger("tokenmill.router.decision").setLevel(logging.DEBUG)
    router = Router(config, specs)
    app = build_router_app(
        router,
        PromptHasher.from_model(model),
        api_key=api_key,
        protect_metrics=protect_metrics,
        gateway_config=gateway_config,
        cluster=cluster,
        replica_key=replica_key,
    )
    logger.warning(
        "tokenmill router on http://%s:%d (%s%s) -> %s",
        host, port, config.policy, ", API key required" if api_key else "",
        ", ".join(s.url for s in specs),
    )  # fmt: skip
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            http=envelope_protocol(),  # uvicorn's own 400s in the OpenAI error envelope too
        )
    )
    signal.signal(signal.SIGTERM, lambda *_: None)  # uvicorn drains, then re-raises: exit 0
    asyncio.run(server.serve())
    return 0


def ray_worker_host(ray: RayConfig, host: str) -> str | None:
    """Where Ray workers bind: on a cluster of this machine alone (`--ray auto`), the
    router's own --host (a wildcard: this node's address); on a multi-node cluster, each
    node's address (None), which other nodes reach."""
    from tokenmill.cluster.ray_config import AUTO

    if ray.address != AUTO or host in ("0.0.0.0", "::", ""):
        return None
    return host


def cmd_router(args: argparse.Namespace) -> int:
    from tokenmill.router.auth import resolve_api_key

    specs = [ReplicaSpec.parse(r) for r in args.replica]
    return run_router(
        router_config(args), specs, args.model, args.host, args.port, args.log_decisions,
        resolve_api_key(args.api_key, args.api_key_file), args.protect_metrics,
        args.gateway_config,
    )  # fmt: skip


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
