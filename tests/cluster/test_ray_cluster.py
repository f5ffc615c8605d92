"""`tokenmill cluster --ray ADDRESS` on a real local Ray cluster the tests start: a head and
a second node process on this machine, one worker placed on each (STRICT_SPREAD).

Outputs at temperature 0 are compared with a single local replica's. Under load, every
request must complete (or, only where a replica is killed, end with a clean error) and none
may hang: each has a client timeout, and running out of it fails the test."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import (
    PROMPTS,
    RunningCluster,
    assert_matches_reference,
    reference_outputs,
    single,
    start_tokenmill_cluster,
    under_load,
)

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster as RayCluster  # noqa: E402

SPREAD = ["--ray-strategy", "STRICT_SPREAD", "--ray-memory", "0.5", "--num-threads", "1"]


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ray")


@pytest.fixture(scope="module")
def reference(log_dir) -> dict[str, str]:
    return reference_outputs(log_dir)


@pytest.fixture(scope="module")
def ray_nodes(reference) -> Iterator[RayCluster]:
    """A head and a second node (separate raylets), 2 logical CPUs each; always shut down."""
    t0 = time.monotonic()
    nodes = RayCluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "object_store_memory": 80 << 20,
                        "include_dashboard": False},
    )  # fmt: skip
    try:
        nodes.add_node(num_cpus=2, object_store_memory=80 << 20)
        nodes.wait_for_nodes()
        print(f"ray head + node up in {time.monotonic() - t0:.1f}s")
        yield nodes
    finally:
        nodes.shutdown()


@pytest.fixture(scope="module")
def ray_cluster(ray_nodes, reference, log_dir) -> Iterator[RunningCluster]:
    t0 = time.monotonic()
    args = ["--ray", ray_nodes.address, *SPREAD, "--replicas", "2"]
    c = start_tokenmill_cluster(args, log_dir, reference, 2)
    print(f"tokenmill cluster --ray: 2 replicas serving in {time.monotonic() - t0:.1f}s "
          f"(actors ready in {[w['ready_s'] for w in c.workers()]} s)")  # fmt: skip
    yield c
    assert c.stop() == 0, c.log()[-3000:]


# ---------------------------------------------------------------- tests


def test_replicas_on_both_nodes_serve_like_one_local_replica(ray_cluster):
    c = ray_cluster
    workers = c.workers()
    assert len(workers) == 2 and len({w["node_id"] for w in workers}) == 2, workers
    first = [asyncio.run(single(c.url, i, stream=i % 3 == 0)) for i in range(len(PROMPTS))]
    outcomes = first + under_load(c, lambda: None, settle_s=1.0)
    assert all(o.ok for o in outcomes), [o for o in outcomes if not o.ok]
    assert_matches_reference(c, outcomes)
    assert {o.replica for o in outcomes} == {w["replica"] for w in workers}  # both nodes


@pytest.mark.slow
def test_replicas_answer_only_the_router_s_key(ray_cluster):
    """Workers bind the node's network address (other nodes must reach them): each requires
    the cluster's replica key (generated: none was given), which only the router presents."""
    import httpx

    for w in ray_cluster.workers():
        direct = httpx.get(w["url"] + "/v1/models", timeout=10)
        assert direct.status_code == 401, (w["url"], direct.text)
        spoofed = httpx.get(w["url"] + "/v1/models", headers={"Authorization": "Bearer x"})
        assert spoofed.status_code == 401
    assert httpx.get(ray_cluster.url + "/v1/models", timeout=10).status_code == 200


def test_a_killed_replica_actor_is_restarted_and_rejoins(ray_cluster):
    c = ray_cluster
    c.wait(lambda: c.serving(2), 120, "2 replicas before the kill")
    victim = c.workers()[1]
    timings = {}

    def kill() -> None:
        t0 = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)  # the actor's process: a failure, not a stop

        def back() -> bool:
            w = next(w for w in c.workers() if w["id"] == victim["id"])
            names = {r["name"] for r in c.replicas()}
            if "down_s" not in timings and victim["replica"] not in {
                r["name"] for r in c.replicas() if r["healthy"]
            }:
                timings["down_s"] = time.monotonic() - t0
            return (
                w["status"] == "ready" and w["restarts"] == 1 and w["replica"] in names
                and victim["replica"] not in names and c.serving(2)
            )  # fmt: skip

        c.wait(back, 180, "the killed actor restarted and rejoined")
        timings["restart_s"] = time.monotonic() - t0

    outcomes = under_load(c, kill, settle_s=4.0)
    bad = [o for o in outcomes if not o.ok]
    print(f"kill -> out of routing {timings.get('down_s', -1):.1f}s, "
          f"-> restarted and routed again {timings['restart_s']:.1f}s; "
          f"{len(outcomes)} requests, {len(bad)} clean errors")  # fmt: skip
    assert not [o for o in outcomes if o.status == "hung"]
    for o in bad:  # a clean error: the OpenAI envelope, and a stream that ends
        assert o.error is not None and o.error.get("message"), o
        assert o.status in (200, 502, 503), o
        assert not o.stream or o.status != 200 or o.done, o
    assert len(bad) <= 16, bad  # only what was running on the killed replica
    assert_matches_reference(c, outcomes)
    w = next(w for w in c.workers() if w["id"] == victim["id"])
    print(f"restarted actor ready in {w['ready_s']} s")
    restarted = w["replica"]
    # the restarted replica takes requests again (its index rebuilt from its events)
    served = {asyncio.run(single(c.url, i, stream=False)).replica for i in range(12)}
    assert restarted in served, (restarted, served)
    assert "restarted" in c.log()


@pytest.mark.slow
def test_scale_2_1_2_under_load_loses_no_request(ray_cluster):
    c = ray_cluster
    c.wait(lambda: c.serving(2), 120, "2 replicas before scaling")

    timings = {}

    def two_one_two() -> None:
        t0 = time.monotonic()
        c.scale(1)
        timings["down_s"] = time.monotonic() - t0
        time.sleep(2.0)
        t0 = time.monotonic()
        c.scale(2)
        timings["up_s"] = time.monotonic() - t0

    outcomes = under_load(c, two_one_two, settle_s=3.0)
    drained = [line for line in c.log().splitlines() if "draining (" in line]
    print(f"scale 2->1 {timings['down_s']:.1f}s, 1->2 {timings['up_s']:.1f}s; "
          f"{len(outcomes)} requests; {drained[-1:]}")  # fmt: skip
    assert drained, "scale-down did not drain"
    bad = [o for o in outcomes if not o.ok]
    assert not bad, bad
    assert len(outcomes) >= 20
    assert_matches_reference(c, outcomes)
    workers = c.workers()
    assert len({w["node_id"] for w in workers}) == 2, workers  # the freed bundle was reused


@pytest.mark.slow
def test_prefill_and_decode_workers_on_two_nodes(ray_nodes, reference, log_dir):
    """P/D on Ray: the prefill worker's KV server is reachable from the other node's decode
    worker; every prompt is prefilled remotely and the outputs stay the reference's."""
    args = ["--ray", ray_nodes.address, *SPREAD, "--prefill", "1", "--decode", "1",
            "--pd-mode", "always"]  # fmt: skip
    c = start_tokenmill_cluster(args, log_dir, reference, 2)
    try:
        workers = c.workers()
        assert {w["role"] for w in workers} == {"prefill", "decode"}
        assert len({w["node_id"] for w in workers}) == 2, workers
        outcomes = [asyncio.run(single(c.url, i, stream=i % 2 == 0)) for i in range(len(PROMPTS))]
        assert all(o.ok for o in outcomes), outcomes
        assert_matches_reference(c, outcomes)

        def sent() -> dict:
            prefill = next(r for r in c.replicas() if r["role"] == "prefill")
            return prefill["kv_transfer"] or {}

        # every prompt went through the prefill worker; the long ones sent their blocks
        c.wait(lambda: sent().get("transfers_served", 0) >= len(PROMPTS), 10, "remote prefills")
        assert sent()["blocks_sent"] >= 2 * 4, sent()
    finally:
        assert c.stop() == 0, c.log()[-3000:]
