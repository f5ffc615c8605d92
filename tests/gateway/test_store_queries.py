"""Read-side queries: spend, rollups by key/team/day/model, paging, totals, event lists."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.store_helpers import DAY, T0, guardrail, tool_call, usage
from tokenmill.gateway.store import Ledger, StoredKey, keys_table
from tokenmill.gateway.store import queries as q
from tokenmill.gateway.store.database import Database

# (key, team, model, day index, cost, prompt, cached, completion)
ROWS = [
    ("k1", "red", "small", 0, 0.10, 100, 10, 20),
    ("k1", "red", "big", 0, 0.50, 200, 0, 40),
    ("k1", "red", "small", 1, 0.20, 50, 5, 10),
    ("k2", "red", "big", 1, 1.00, 300, 30, 60),
    ("k3", "blue", "small", 2, 0.25, 10, 0, 1),
    (None, None, "small", 2, 0.00, 1, 0, 1),  # an unauthenticated request
]


@pytest.fixture
def db(db_url: str, tmp_path: Path) -> Iterator[Database]:
    with Ledger.open(db_url, tmp_path / "journal") as ledger:
        for i, (key, team, model, day, cost, p, c, o) in enumerate(ROWS):
            ledger.record(
                usage(
                    i, key_id=key, team=team, model=model, cost_usd=cost, prompt_tokens=p,
                    cached_tokens=c, completion_tokens=o, created=T0 + day * DAY + 3600 * i,
                )
            )  # fmt: skip
        for seq, rule in enumerate(["no-ssn", "no-card"]):
            ledger.record(guardrail("req-0", seq, rule=rule, key_id="k1", created=T0 + seq))
        ledger.record(guardrail("req-4", 0, key_id="k3", stage="output", created=T0 + 2 * DAY))
        ledger.record(tool_call("req-0", 0, key_id="k1", allowed=True, reason=None))
        ledger.record(tool_call("req-0", 1, key_id="k1", allowed=False, tool_name="rm"))
        assert ledger.flush()
        yield ledger.db


def expected(select, group) -> dict:
    out: dict = {}
    for row in ROWS:
        if not select(row):
            continue
        g = out.setdefault(group(row), [0, 0, 0, 0, 0.0])
        g[0] += 1
        g[1] += row[5]
        g[2] += row[6]
        g[3] += row[7]
        g[4] += row[4]
    return out


def as_map(rows: list[dict], name: str) -> dict:
    keys = ["requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd"]
    return {r[name]: [r[k] for k in keys] for r in rows}


def check(rows: list[dict], name: str, want: dict) -> None:
    got = as_map(rows, name)
    assert got.keys() == want.keys()
    for k, values in want.items():
        assert got[k][:4] == values[:4]
        assert got[k][4] == pytest.approx(values[4])


def test_rollup_by_key_team_model(db: Database) -> None:
    check(q.usage_rollup(db, group_by="key"), "key_id", expected(lambda r: True, lambda r: r[0]))
    check(q.usage_rollup(db, group_by="team"), "team", expected(lambda r: True, lambda r: r[1]))
    check(
        q.usage_rollup(db, group_by="model", team="red"),
        "model",
        expected(lambda r: r[1] == "red", lambda r: r[2]),
    )
    check(
        q.usage_rollup(db, group_by="model", key_id="k1"),
        "model",
        expected(lambda r: r[0] == "k1", lambda r: r[2]),
    )


def test_rollup_by_key_names_each_key(db: Database) -> None:
    keys_table.insert_key(db, StoredKey(id="k1", key_hash="a" * 64, name="alpha"))
    keys_table.insert_key(db, StoredKey(id="k2", key_hash="b" * 64))
    keys_table.revoke_key(db, "k1", T0)  # a revoked key keeps its name
    rows = q.usage_rollup(db, group_by="key")
    names = {r["key_id"]: r["key_name"] for r in rows}
    assert names == {"k1": "alpha", "k2": None, "k3": None, None: None}  # k3: not in the table
    assert [list(r)[:2] for r in rows] == [["key_id", "key_name"]] * len(rows)
    assert "key_name" not in q.usage_rollup(db, group_by="team")[0]


def test_rollup_by_utc_day_and_window(db: Database) -> None:
    days = q.usage_rollup(db, group_by="day")
    assert [d["day"] for d in days] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    check(days, "day", expected(lambda r: True, lambda r: f"2026-01-0{r[3] + 1}"))
    window = q.usage_rollup(db, group_by="day", since=T0 + DAY, until=T0 + 2 * DAY)
    check(window, "day", expected(lambda r: r[3] == 1, lambda r: "2026-01-02"))
    with pytest.raises(ValueError):
        q.usage_rollup(db, group_by="week")  # type: ignore[arg-type]


def test_spend_and_totals(db: Database) -> None:
    assert q.spend(db, "k1", since=0) == pytest.approx(0.80)
    assert q.spend(db, "k1", since=T0 + DAY) == pytest.approx(0.20)
    assert q.spend(db, "nobody", since=0) == 0.0
    assert q.team_spend(db, "red", since=T0 + DAY) == pytest.approx(1.20)
    total = q.totals(db)
    assert total["requests"] == len(ROWS)
    assert total["tokens"] == sum(r[5] + r[7] for r in ROWS)
    assert total["cost_usd"] == pytest.approx(sum(r[4] for r in ROWS))
    assert q.totals(db, key_id="k2")["cost_usd"] == pytest.approx(1.00)
    assert q.totals(db, key_id="none")["requests"] == 0


def test_usage_rows_paging(db: Database) -> None:
    everything = q.usage_rows(db, limit=100)
    assert [r.request_id for r in everything] == [f"req-{i}" for i in range(len(ROWS))]
    assert everything[0] == usage(
        0, key_id="k1", team="red", model="small", cost_usd=0.10, prompt_tokens=100,
        cached_tokens=10, completion_tokens=20, created=T0,
    )  # fmt: skip
    pages, after = [], None
    while True:
        page = q.usage_rows(db, limit=4, after_request_id=after)
        if not page:
            break
        pages.append([r.request_id for r in page])
        after = page[-1].request_id
    assert pages == [["req-0", "req-1", "req-2", "req-3"], ["req-4", "req-5"]]
    newest = q.usage_rows(db, limit=2, newest_first=True)
    assert [r.request_id for r in newest] == ["req-5", "req-4"]
    older = q.usage_rows(db, limit=2, newest_first=True, after_request_id="req-4")
    assert [r.request_id for r in older] == ["req-3", "req-2"]
    assert [r.request_id for r in q.usage_rows(db, limit=2, offset=2)] == ["req-2", "req-3"]
    assert [r.request_id for r in q.usage_rows(db, key_id="k2")] == ["req-3"]
    assert len(q.usage_rows(db, since=T0 + 2 * DAY)) == 2


def test_paging_with_equal_timestamps(db_url: str, tmp_path: Path) -> None:
    with Ledger.open(db_url, tmp_path / "journal") as ledger:
        for i in range(7):
            ledger.record(usage(i, created=T0))  # all at the same instant
        assert ledger.flush()
        seen, after = [], None
        while page := q.usage_rows(ledger.db, limit=3, after_request_id=after):
            seen += [r.request_id for r in page]
            after = page[-1].request_id
        assert seen == sorted(f"req-{i}" for i in range(7))


def test_event_lists(db: Database) -> None:
    events = q.guardrail_events(db)
    assert [(e.request_id, e.rule) for e in events] == [
        ("req-4", "no-ssn"), ("req-0", "no-card"), ("req-0", "no-ssn"),
    ]  # fmt: skip
    assert [e.stage for e in q.guardrail_events(db, key_id="k3")] == ["output"]
    assert len(q.guardrail_events(db, request_id="req-0", limit=1)) == 1
    assert q.guardrail_events(db, since=T0 + DAY)[0].key_id == "k3"
    calls = q.tool_call_events(db, key_id="k1")
    assert {(c.seq, c.allowed) for c in calls} == {(0, True), (1, False)}
    blocked = q.tool_call_events(db, allowed=False)
    assert [(c.tool_name, c.allowed, c.reason) for c in blocked] == [
        ("rm", False, "not in allow-list")
    ]
