"""After a plan job ends: settle the capacity sweeps and replans it is a cell of (their progress,
and their end when it was the last cell). Never raises: the sweeper settles what this missed."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from sqlalchemy.orm import Session

from parplan.service.capacity.settle import settle_sweeps_of

log = logging.getLogger("parplan.workers")


def settle_after(job_id: uuid.UUID, sf: Callable[[], Session]) -> None:
    try:
        with sf() as s:
            ended = settle_sweeps_of(s, job_id)
            s.commit()
        for sweep in ended:
            log.info("sweep %s: every cell answered; done", sweep)
    except Exception as e:
        log.warning("job %s: could not settle its sweeps (%s: %s); the sweeper will", job_id,
                    e.__class__.__name__, e)
