"""Limits shared by several API processes: with Redis configured, two app instances draw on one
token bucket per token; without it (or while it is down) each counts alone; and the queue-depth
cap holds exactly under concurrent submissions through both instances."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.auth.service import Scope
from parplan.service.overload import RateLimiter
from parplan.service.shared_rate_limit import SharedRateLimiter
from tests.support.service import make_token

SF = sessionmaker[Session]


def _codes(clients: list[TestClient], headers: dict[str, str], n: int) -> list[int]:
    """``n`` requests, sent to the clients in turn."""
    return [clients[i % len(clients)].get("/v1/jobs", headers=headers).status_code for i in range(n)]


def test_two_instances_share_a_tokens_bucket_in_redis(app_client: Callable[..., TestClient], db: SF) -> None:
    limits = {"rate_limit_per_second": 0.01, "rate_limit_burst": 3}
    first, second = app_client(db, **limits), app_client(db, **limits)
    assert isinstance(first.app.state.runtime.rate_limiter, SharedRateLimiter)  # type: ignore[attr-defined]
    headers = {"Authorization": f"Bearer {make_token(db, Scope.PLANS_READ)}"}
    assert _codes([first, second], headers, 5) == [200, 200, 200, 429, 429]
    r = first.get("/v1/jobs", headers=headers)
    # The bucket is empty: the next request is one token away, 1 / 0.01 = 100 s.
    assert r.status_code == 429 and 99 <= int(r.headers["retry-after"]) <= 100
    # Another token has its own bucket.
    other = {"Authorization": f"Bearer {make_token(db, Scope.PLANS_READ, name='other')}"}
    assert _codes([second], other, 1) == [200]


def test_without_redis_each_instance_counts_alone(app_client: Callable[..., TestClient], db: SF) -> None:
    limits = {"rate_limit_per_second": 0.01, "rate_limit_burst": 3, "broker_url": None}
    first, second = app_client(db, **limits), app_client(db, **limits)
    assert type(first.app.state.runtime.rate_limiter) is RateLimiter  # type: ignore[attr-defined]
    headers = {"Authorization": f"Bearer {make_token(db, Scope.PLANS_READ)}"}
    assert _codes([first, second], headers, 8) == [200] * 6 + [429] * 2


def test_an_unreachable_redis_falls_back_to_the_process_bucket(app_client: Callable[..., TestClient], db: SF) -> None:
    c = app_client(db, rate_limit_per_second=0.01, rate_limit_burst=2, broker_url="redis://127.0.0.1:1/0")
    headers = {"Authorization": f"Bearer {make_token(db, Scope.PLANS_READ)}"}
    assert _codes([c], headers, 3) == [200, 200, 429]


def test_the_shared_bucket_refills_at_the_rate(redis_url: str, queue_name: str) -> None:
    limiter = SharedRateLimiter(10.0, 2, redis_url, prefix=f"{queue_name}:rate")
    try:
        assert [limiter.wait_seconds("t") for _ in range(2)] == [0.0, 0.0]
        wait = limiter.wait_seconds("t")
        assert 0.05 < wait <= 0.1  # a tenth of a second per request, minus what refilled meanwhile
        time.sleep(0.25)  # 2.5 requests' worth refill (the refused try took nothing)
        assert limiter.wait_seconds("t") == 0.0
    finally:
        limiter._redis.delete(f"{queue_name}:rate:t")
        limiter.close()


def test_the_queue_depth_cap_holds_across_instances(app_client: Callable[..., TestClient], committed_db: SF) -> None:
    """Eight new jobs at once through two instances with room for three: three are admitted."""
    first, second = (app_client(committed_db, max_queued_jobs=3) for _ in range(2))
    headers = {"Authorization": f"Bearer {make_token(committed_db, Scope.PLANS_WRITE)}"}

    def submit(i: int) -> int:
        body = {"model": {"preset": "bert-large"}, "cluster": {"gpus": 2}, "training": {"seq_len": 64 + i}}
        return (first, second)[i % 2].post("/v1/plans", json=body, headers=headers).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(submit, range(8)))
    assert sorted(codes) == [202] * 3 + [503] * 5, codes
