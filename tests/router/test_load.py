"""Booking: pending prefill until the first token (or a TTL), distinct active blocks."""

from __future__ import annotations

from tokenmill.router.load import LoadTracker


def test_pending_prefill_until_first_token_or_ttl():
    lt = LoadTracker(booking_ttl_s=10)
    a = lt.book("r1", "x", (1, 2, 3), 3.0, now=0)
    lt.book("r2", "x", (1, 2, 4), 1.0, now=0)
    assert lt.pending_prefill("x", now=1) == 4.0
    lt.first_token(a)
    assert lt.pending_prefill("x", now=1) == 1.0
    assert lt.pending_prefill("x", now=11) == 0.0  # TTL: a non-streamed request's prefill
    assert lt.in_flight("x") == 2 and lt.pending_prefill("y") == 0.0


def test_pending_prefill_ahead_of_a_prompt_on_shared_steps():
    lt = LoadTracker()
    lt.book("long", "x", (1,), 375.0, now=0)
    lt.book("short", "x", (2,), 4.0, now=0)
    assert lt.pending_prefill("x", now=1) == 379.0
    assert lt.pending_prefill("x", now=1, share=10.0) == 14.0  # 10 of the long one, all of 4


def test_active_blocks_count_shared_prefixes_once():
    lt = LoadTracker()
    a = lt.book("r1", "x", (1, 2, 3), 3.0)
    b = lt.book("r2", "x", (1, 2, 4), 1.0)
    assert lt.active_blocks("x") == 4 + 2  # {1,2,3,4} + one tail per request
    assert lt.active_blocks("x", (1, 2, 9)) == 4 + 2 + 1
    assert lt.active_blocks("y", (1, 2)) == 2
    lt.finish(a)
    assert lt.active_blocks("x") == 3 + 1
    lt.finish(b)
    lt.finish(b)  # idempotent
    assert lt.active_blocks("x") == 0 and lt.in_flight("x") == 0 and lt.total_in_flight() == 0


def test_same_request_id_twice_books_and_releases_each_attempt():
    """The client's X-Request-Id is not unique: two requests with the same one must not
    overwrite each other's booking (the first's load would stay forever)."""
    lt = LoadTracker()
    a = lt.book("dup", "x", (1, 2, 3), 3.0)
    b = lt.book("dup", "x", (1, 2, 4), 1.0)
    assert lt.in_flight("x") == 2 and lt.pending_prefill("x") == 4.0
    lt.finish(b)
    assert lt.in_flight("x") == 1 and lt.active_blocks("x") == 3 + 1
    lt.finish(b)  # a second finish of the same booking does not release the other one
    assert lt.in_flight("x") == 1
    lt.finish(a)
    assert lt.in_flight("x") == 0 and lt.active_blocks("x") == 0 and lt.pending_prefill("x") == 0
