"""The per-token rate limit shared by every API process: token buckets kept in Redis, and the
factory that picks them when Redis is configured (else each process keeps its own).

Each bucket is a Redis hash (tokens left, when last updated) changed by one Lua script, so a
check is atomic across processes and costs one round trip. The script reads Redis's own clock, so
the API hosts' clocks do not matter. A bucket left alone until it is full again expires.
While Redis cannot be reached, each process falls back to its own buckets
(:class:`~parplan.service.overload.RateLimiter`) and tries Redis again after ``retry_seconds``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable
from typing import Any

import redis

from parplan.service.overload import RateLimiter
from parplan.service.settings import Settings

log = logging.getLogger("parplan.service")

# KEYS[1]: the bucket; ARGV: rate (requests/s), burst, expiry (ms). Returns the wait in seconds
# (0: allowed), as a string, since Lua numbers reach the client as integers.
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(b[1]) or burst
local at = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return tostring(wait)
"""


def key_text(key: Hashable) -> str:
    """A bucket's name: a token id, or ``address:<host>``."""
    return ":".join(map(str, key)) if isinstance(key, tuple) else str(key)


class SharedRateLimiter(RateLimiter):
    def __init__(self, rate: float, burst: int, url: str, *, prefix: str, retry_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(rate, burst, clock)
        self.prefix, self.retry_seconds = prefix, retry_seconds
        self._redis: Any = redis.Redis.from_url(url, socket_connect_timeout=0.25, socket_timeout=0.25)
        self._take = self._redis.register_script(TAKE)
        #: a full bucket's refill time, then a second: long enough that an expired bucket was full
        self._expiry_ms = math.ceil(burst / rate * 1000) + 1000
        self._down_until = 0.0

    def wait_seconds(self, key: Hashable) -> float:
        now = self.clock()
        if now >= self._down_until:
            try:
                wait = self._take(keys=[f"{self.prefix}:{key_text(key)}"], args=[self.rate, self.burst,
                                                                               self._expiry_ms])
                return float(wait)
            except redis.RedisError as e:
                self._down_until = now + self.retry_seconds
                log.warning("rate limit: Redis unreachable (%s); this process counts alone for %gs",
                            e.__class__.__name__, self.retry_seconds)
        return super().wait_seconds(key)

    def close(self) -> None:
        self._redis.close()


def make_rate_limiter(settings: Settings) -> RateLimiter | None:
    """None without a limit; buckets in Redis when there is one (``broker_url``), else in this process."""
    if settings.rate_limit_per_second <= 0:
        return None
    if settings.broker_url:
        return SharedRateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst, settings.broker_url,
                                 prefix=f"{settings.queue_name}:rate")
    return RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst)
