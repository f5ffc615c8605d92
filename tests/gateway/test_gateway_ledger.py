"""The ledger against what clients were told: 500 mixed requests (streamed with and without
usage, non-streamed, upstream errors, rejections, clients leaving mid-stream)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from tests.gateway.harness import make_harness


@pytest.fixture
def harness(tmp_path, db_url):  # a SQLite file and a real PostgreSQL server
    h = make_harness(tmp_path, {"database": db_url})
    yield h
    h.close()


async def leave_mid_stream(app, key: str, body: dict, after_messages: int, rid: str) -> list[dict]:
    """A raw ASGI client that disconnects after `after_messages` body messages."""
    payload = json.dumps(body).encode()
    got: list[dict] = []
    left = asyncio.Event()
    sent = [False]

    async def receive():
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        got.append(message)
        if sum(m["type"] == "http.response.body" for m in got) >= after_messages:
            left.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("gw", 80),
             "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json"),
                         (b"x-request-id", rid.encode())]}  # fmt: skip
    await asyncio.wait_for(app(scope, receive, send), 30)
    return got


def test_ledger_totals_equal_the_usage_clients_were_given(harness):
    rng = random.Random(7)

    async def main():
        key, key_id = await harness.new_key()
        told: dict[str, tuple[int, int, int]] = {}  # request id -> the usage the client got
        kinds = []

        async with harness.client(key) as c:

            async def one(i: int):
                kind = rng.choice(["json", "stream_usage", "stream", "error", "leave"])
                kinds.append(kind)
                rid = f"req-{i}"
                headers = {"x-request-id": rid}

                def add(usage):
                    told[rid] = (usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"],
                                 usage["completion_tokens"])  # fmt: skip

                pieces = [f"w{j} " for j in range(rng.randint(1, 12))]
                body = {"model": "m", "messages": [{"role": "user", "content": "q" * rng.randint(1, 400)}],
                        "x_script": {"pieces": pieces, "cached": rng.randint(0, 50), "delay": 0.001}}  # fmt: skip
                if kind == "json":
                    add(
                        (await c.post("/v1/chat/completions", json=body, headers=headers)).json()[
                            "usage"
                        ]
                    )
                elif kind == "error":
                    body["x_script"]["status"] = 400
                    assert (
                        await c.post("/v1/chat/completions", json=body, headers=headers)
                    ).status_code == 400
                elif kind == "leave":
                    body["x_script"].update(pieces=[f"w{j} " for j in range(20)], delay=0.02)
                    await leave_mid_stream(harness.app, key, {**body, "stream": True}, 3, rid)
                else:
                    body["stream"] = True
                    if kind == "stream_usage":
                        body["stream_options"] = {"include_usage": True}
                    reply = await c.post("/v1/chat/completions", json=body, headers=headers)
                    chunks = [
                        json.loads(x[6:])
                        for x in reply.text.splitlines()
                        if x.startswith("data: {")
                    ]
                    usages = [ch["usage"] for ch in chunks if ch.get("usage")]
                    if kind == "stream":
                        assert usages == [] and all("usage" not in ch for ch in chunks)
                        return
                    assert len(usages) == 1 and chunks[-1]["choices"] == []
                    add(usages[0])

            for start in range(0, 500, 50):
                await asyncio.gather(*[one(i) for i in range(start, start + 50)])

        rows = {r[0]: r for r in harness.ledger_rows()}
        assert len(rows) == 500
        statuses = [r[6] for r in rows.values()]
        assert statuses.count(400) == kinds.count("error")
        assert statuses.count(499) == kinds.count("leave")
        assert statuses.count(200) == 500 - kinds.count("error") - kinds.count("leave")
        for rid, usage in told.items():  # exactly what each client was told
            assert rows[rid][2:5] == usage, rid
        assert sum(u[2] for u in told.values()) == sum(rows[rid][4] for rid in told)
        for r in rows.values():
            if r[6] == 499:  # a client that left still pays for what ran before it left
                assert 0 < r[4] < 20
            if r[6] == 400:
                assert r[2] == r[4] == 0 and r[7] == "scripted"
        assert len(told) == kinds.count("json") + kinds.count("stream_usage")

    asyncio.run(main())
