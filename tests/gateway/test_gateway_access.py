"""Keys, the admin API, limits and budgets through the gateway middleware (fake upstream)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.gateway.harness import ADMIN_KEY, make_harness

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def harness(tmp_path):
    h = make_harness(tmp_path)
    yield h
    h.close()


def run(coro):
    return asyncio.run(coro)


def test_unknown_missing_revoked_expired_keys_get_401(harness):
    async def main():
        key, key_id = await harness.new_key(name="a")
        soon, _ = await harness.new_key(name="b", expires_at=time.time() + 0.5)
        async with harness.client(key) as c:
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        for bad in (None, "tm-nope", key + "x", "Bearer"):
            async with harness.client(bad) as c:
                reply = await c.post("/v1/chat/completions", json=CHAT)
                assert reply.status_code == 401
                assert reply.json()["error"]["code"] == "invalid_api_key"
                assert (await c.get("/v1/models")).status_code == 401
        async with harness.client(ADMIN_KEY) as admin:
            assert (await admin.delete(f"/admin/keys/{key_id}")).status_code == 200
        async with harness.client(key) as c:
            reply = await c.post("/v1/chat/completions", json=CHAT)
            assert reply.status_code == 401 and key not in reply.text
        await asyncio.sleep(0.6)
        async with harness.client(soon) as c:
            reply = await c.post("/v1/chat/completions", json=CHAT)
            assert reply.status_code == 401 and "expired" in reply.json()["error"]["message"]

    run(main())


def test_admin_api_needs_the_admin_key_and_keys_are_stored_hashed(harness):
    async def main():
        key, key_id = await harness.new_key(name="n", team="t", models=["m"], rpm=5)
        for bad in (None, key, "admin-wrong"):
            async with harness.client(bad) as c:
                assert (await c.get("/admin/keys")).status_code == 401
                assert (await c.post("/admin/keys", json={})).status_code == 401
        async with harness.client(ADMIN_KEY) as admin:
            listed = (await admin.get("/admin/keys")).json()["data"]
            assert [k["id"] for k in listed] == [key_id]
            assert key not in str(listed) and "key_hash" not in listed[0]
            rotated = (await admin.post(f"/admin/keys/{key_id}/rotate")).json()["key"]
            bad = await admin.post("/admin/keys", json={"rpm": -1})
            assert bad.status_code == 400 and "rpm" in bad.json()["error"]["message"]
            bad = await admin.post("/admin/keys", json={"nonsense": 1})
            assert bad.status_code == 400
            bad = await admin.post("/admin/keys", json={"tool_policy": "missing"})
            assert bad.status_code == 400
        async with harness.client(key) as c:  # the old secret stops working at rotation
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 401
        async with harness.client(rotated) as c:
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        stored = harness.gateway.db.fetchall("SELECT * FROM api_keys")
        assert key not in str(stored) and rotated not in str(stored)

    run(main())


def test_model_allowlist(harness):
    async def main():
        key, _ = await harness.new_key(models=["other"])
        async with harness.client(key) as c:
            reply = await c.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 403 and reply.json()["error"]["code"] == "model_not_allowed"
        assert harness.seen.bodies == []

    run(main())


def test_requests_per_minute_admit_exactly_the_limit_under_concurrency(harness):
    async def main():
        key, _ = await harness.new_key(rpm=7)
        async with harness.client(key) as c:
            replies = await asyncio.gather(
                *[c.post("/v1/chat/completions", json=CHAT) for _ in range(20)]
            )
        codes = [r.status_code for r in replies]
        assert codes.count(200) == 7 and codes.count(429) == 13
        limited = next(r for r in replies if r.status_code == 429)
        assert int(limited.headers["retry-after"]) >= 1
        assert limited.json()["error"]["code"] == "requests_per_minute"

    run(main())


def test_max_parallel_admits_exactly_the_limit(harness):
    async def main():
        key, _ = await harness.new_key(max_parallel=3)
        slow = {**CHAT, "stream": True, "x_script": {"pieces": ["a", "b"], "delay": 0.3}}
        async with harness.client(key) as c:
            replies = await asyncio.gather(
                *[c.post("/v1/chat/completions", json=slow) for _ in range(10)]
            )
            codes = [r.status_code for r in replies]
            assert codes.count(200) == 3 and codes.count(429) == 7
            # the slots come back when the requests end
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200

    run(main())


def test_tokens_per_minute(harness):
    async def main():
        key, _ = await harness.new_key(tpm=10)
        async with harness.client(key) as c:
            first = await c.post("/v1/chat/completions", json=CHAT)
            assert first.status_code == 200 and first.json()["usage"]["total_tokens"] > 10
            second = await c.post("/v1/chat/completions", json=CHAT)
        assert second.status_code == 429 and second.json()["error"]["code"] == "tokens_per_minute"

    run(main())


def test_budget_is_a_hard_stop_under_concurrency(harness):
    """Each request reserves the most it can cost (body bytes as prompt tokens, max_tokens
    as output); one is admitted only when that fits beside what was spent and reserved, so
    concurrent requests never spend past the budget."""

    async def main():
        # prices: $1 / $2 per million input / output tokens; each request reserves ~1e-4
        # (~70 body bytes, 8 output tokens) and costs ~2e-5 (the fake's usage)
        budget = 0.0003
        key, key_id = await harness.new_key(budget_usd=budget, budget_period="day")
        body = {**CHAT, "max_tokens": 8}
        async with harness.client(key) as c:
            replies = await asyncio.gather(
                *[c.post("/v1/chat/completions", json=body) for _ in range(40)]
            )
            codes = [r.status_code for r in replies]
            assert 200 in codes and 429 in codes and set(codes) == {200, 429}
            refused = next(r for r in replies if r.status_code == 429).json()["error"]
            assert refused["code"] == "budget_exceeded" and refused["type"] == "insufficient_quota"
            later = [(await c.post("/v1/chat/completions", json=body)).status_code
                     for _ in range(20)]  # fmt: skip
            assert later[-1] == 429
            # one that could cost more than what is left is refused even alone
            big = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10**6})
            assert big.status_code == 429 and "may cost up to" in big.json()["error"]["message"]
        rows = harness.ledger_rows()
        spent = sum(r[5] for r in rows if r[1] == key_id)
        reserve = (len(json.dumps(body, separators=(",", ":"))) + 8 * 2) / 1e6
        assert budget - 1.5 * reserve < spent <= budget  # admitted while a reservation fit

    run(main())


def test_a_key_sees_only_its_own_usage(harness):
    async def main():
        a, a_id = await harness.new_key(name="a")
        b, b_id = await harness.new_key(name="b")
        async with harness.client(a) as c:
            for _ in range(3):
                await c.post("/v1/chat/completions", json=CHAT)
        async with harness.client(b) as c:
            await c.post("/v1/chat/completions", json=CHAT)
            own = (
                await c.get("/v1/usage", params={"group_by": "key", "include_requests": "true"})
            ).json()
            assert [row["requests"] for row in own["data"]] == [1]
            assert {r["key_id"] for r in own["requests"]} == {b_id}
            other = await c.get("/v1/usage", params={"key_id": a_id})
            assert other.status_code == 403
        async with harness.client(ADMIN_KEY) as admin:
            everyone = (await admin.get("/admin/usage", params={"group_by": "key"})).json()["data"]
            assert sorted(row["requests"] for row in everyone) == [1, 3]

    run(main())


def test_batch_lines_run_as_their_key_and_wait_for_its_rate_limits(harness):
    """A batch line goes through the gateway as the key that made the batch (models, ledger);
    a revoked key's lines are refused; a rate-limited key's lines wait for their turn."""
    from tokenmill.gateway.batch_lines import run_line_as_key

    async def main():
        gw = harness.gateway
        key, key_id = await harness.new_key(rpm=2, models=["m"])
        owner = "gateway-key:" + key_id
        other = {**CHAT, "model": "other"}
        line = await run_line_as_key(gw, owner, "/v1/chat/completions", other, "b-0")
        assert line.status == 403 and line.body["error"]["code"] == "model_not_allowed"
        for request_id in ("b-1", "b-2"):
            line = await run_line_as_key(gw, owner, "/v1/chat/completions", CHAT, request_id)
            assert line.status == 200 and line.body["usage"]["total_tokens"] > 0
        stored = gw.keys.check_id(key_id).key
        wait = gw.limiter.ready_in(stored, gw.config.defaults)
        assert 25 < wait <= 30  # two requests of rpm 2 taken: the next in ~30 s
        assert gw.limiter.ready_in(stored, gw.config.defaults) == pytest.approx(wait, abs=1)
        free, free_id = await harness.new_key()
        assert gw.limiter.ready_in(gw.keys.check_id(free_id).key, gw.config.defaults) == 0
        async with harness.client(ADMIN_KEY) as admin:
            assert (await admin.delete(f"/admin/keys/{free_id}")).status_code == 200
        gone = "gateway-key:" + free_id
        line = await run_line_as_key(gw, gone, "/v1/chat/completions", CHAT, "b-4")
        assert line.status == 401 and line.body["error"]["code"] == "invalid_api_key"
        line = await run_line_as_key(gw, "someone", "/v1/chat/completions", CHAT, "b-5")
        assert line.status == 401
        rows = harness.ledger_rows()
        assert sorted((r[0], r[1], r[6]) for r in rows) == [
            ("b-0", key_id, 403), ("b-1", key_id, 200), ("b-2", key_id, 200)]  # fmt: skip

    run(main())
