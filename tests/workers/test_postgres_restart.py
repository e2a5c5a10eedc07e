"""PostgreSQL restarted while jobs run, in the production layout: ``parplan serve`` (with its
sweeper) and a Celery worker on a private PostgreSQL cluster (see :mod:`private_postgres`; the
machine's shared server is never stopped) and the shared Redis (a queue of the test's own).

While the database is down every API request that needs it answers 503 problem+json with a
``Retry-After``, never a 500; when it is back the same processes recover by themselves (no
restart), and every job submitted before the outage finishes exactly once."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from private_postgres import ClusterUnavailableError, PrivateCluster, find_binaries, wait_until
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from parplan.service.auth.service import Scope
from parplan.service.models import Job, JobEvent, Plan
from tests.support.service import (
    FAST_REQUEST,
    MEDIUM_REQUEST,
    Proc,
    finished,
    make_token,
    poll_job,
    service_env,
    settings_env,
    start_server,
    start_worker,
)

#: How long the database stays down, in seconds: longer than a heartbeat, so the worker's lease
#: renewals fail during it, and short enough for the test's time budget.
OUTAGE_SECONDS = 4.0


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    try:
        c = PrivateCluster(find_binaries()).init()
    except ClusterUnavailableError as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"no private PostgreSQL cluster: {e} (CI=true needs one)")
        pytest.skip(f"no private PostgreSQL cluster: {e}")
    c.start()
    yield c
    c.destroy()


@pytest.fixture
def engine(cluster: PrivateCluster) -> Iterator[Engine]:
    """The test's own view of the private database (no pool: nothing stale after the restart)."""
    eng = create_engine(cluster.migrate(), poolclass=NullPool)
    yield eng
    eng.dispose()


def _is_unavailable_problem(r: httpx.Response) -> bool:
    return (r.status_code == 503 and r.headers.get("content-type", "").startswith("application/problem+json")
            and r.json().get("status") == 503 and r.headers.get("retry-after", "").isdigit())


def _terminal_events(sf: sessionmaker[Session], job_id: str) -> list[str]:
    with sf() as s:
        return list(s.scalars(select(JobEvent.status).where(JobEvent.job_id == uuid.UUID(job_id),
                                                            JobEvent.status.in_(("succeeded", "failed",
                                                                                 "cancelled")))))


@pytest.mark.parametrize("stop_mode", ["immediate", "fast"])
def test_postgres_restart_answers_503_then_recovers_and_every_job_finishes_once(
        stop_mode: str, cluster: PrivateCluster, engine: Engine, redis_url: str, queue_name: str,
        procs: list[Proc]) -> None:
    sf = sessionmaker(bind=engine, expire_on_commit=False)
    # A 5 s lease: the outage (4 s) plus a loaded machine's lag may still expire it, which the
    # test allows (the sweeper then hands the job to a new attempt); what it forbids is a second end.
    env = service_env(settings_env(str(engine.url.render_as_string(hide_password=False)), redis_url, queue_name,
                                   job_lease_seconds=5))
    server, base = start_server(env)
    procs.append(server)
    procs.append(start_worker(env))  # concurrency 1: one job runs, the others wait for it
    token = make_token(sf, Scope.PLANS_WRITE)
    bodies = [MEDIUM_REQUEST] + [FAST_REQUEST | {"cluster": {"gpus": n}} for n in (2, 4, 8)]
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        urls = [c.post("/v1/plans", json=b).headers["location"] for b in bodies]
        poll_job(c, urls[0], lambda j: j["status"] == "running")

        # immediate: as in a crash (the next start runs recovery); fast: an operator's clean restart.
        cluster.stop(stop_mode)
        answers: list[httpx.Response] = []
        down_until = time.monotonic() + OUTAGE_SECONDS
        while time.monotonic() < down_until:
            answers.append(c.get(urls[1]))
            answers.append(c.post("/v1/plans", json=FAST_REQUEST | {"cluster": {"gpus": 16}}))
            answers.append(c.get("/v1/jobs"))
            time.sleep(0.2)
        cluster.start()

        bad = [(r.request.method, r.request.url.path, r.status_code, r.text[:200]) for r in answers
               if not _is_unavailable_problem(r)]
        assert not bad, f"answers during the outage that are not 503 problems with Retry-After: {bad}"
        assert len(answers) >= 6
        # Recovery needs no restart of the API or the worker.
        wait_until(lambda: c.get(urls[1]).status_code == 200, 20, "the API answering again after the restart")
        jobs: list[dict[str, Any]] = [poll_job(c, u, finished, timeout=120) for u in urls]

    assert [j["status"] for j in jobs] == ["succeeded"] * len(bodies), jobs
    with sf() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == len(bodies)  # the refused POSTs made none
        assert s.scalar(select(func.count()).select_from(Plan)) == len(bodies)
        attempts = {str(j.id): j.attempts for j in s.scalars(select(Job))}
    for j in jobs:
        assert _terminal_events(sf, j["id"]) == ["succeeded"], j  # finished once, never overwritten
        assert 1 <= attempts[j["id"]] <= 2, attempts
