"""`tokenmill router`: the cache-aware router in front of running replicas."""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tokenmill.ports import parse_port
from tokenmill.router.config import POLICIES, CostWeights, GuardConfig, RouterConfig
from tokenmill.router.disagg import DISAGG_MODES, DisaggConfig
from tokenmill.router.replicas import ReplicaSpec

if TYPE_CHECKING:
    from fastapi import APIRouter

    from tokenmill.router.front import Cluster

logger = logging.getLogger("tokenmill.router")


def add_router_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=parse_port, default=8000)
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


def add_router_parsers(sub) -> None:
    p = sub.add_parser("router", help="cache-aware router in front of running replicas")
    p.add_argument(
        "--replica", action="append", required=True, metavar="URL[,EVENTS[,REPLAY]]",
        help="a replica, with its KV event and replay endpoints (repeatable)",
    )  # fmt: skip
    p.add_argument("--model", default=None, help="tokenizer/chat template (default: embedded)")
    add_router_args(p)
    p.set_defaults(func=cmd_router)

def run_router(config: RouterConfig, specs: list[ReplicaSpec], model: str | None, host: str,
               port: int, log_decisions: bool = False, api_key: str | None = None,
               protect_metrics: bool = False, gateway_config: str | None = None,
               cluster: Cluster | None = None, replica_key: str | None = None,
               extra_routes: Sequence[APIRouter] = ()) -> int:  # fmt: skip
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
        extra_routes=extra_routes,
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


def cmd_router(args: argparse.Namespace) -> int:
    from tokenmill.router.auth import resolve_api_key

    specs = [ReplicaSpec.parse(r) for r in args.replica]
    return run_router(
        router_config(args), specs, args.model, args.host, args.port, args.log_decisions,
        resolve_api_key(args.api_key, args.api_key_file), args.protect_metrics,
        args.gateway_config,
    )  # fmt: skip
