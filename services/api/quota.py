"""Per-key quotas on the costly routes: a token bucket per key and quota in Redis, refilled at the
quota per ``KZ_QUOTA_WINDOW_S`` and charged by what a request costs (modules proposed, candidates
generated or scored). Over it: 429 with ``Retry-After``. Without auth, the client's address is the key."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import redis
from fastapi import HTTPException, Request, status
from redis.commands.core import Script

from services.api.unavailable import RETRY_AFTER_S
from services.config import get_settings
from services.queue.app import redis_client

Quota = Literal["proposed_modules", "kernel_candidates", "scored_candidates"]

# Atomic in Redis, so concurrent requests of one key cannot both spend the same tokens. A request costing
# more than the whole bucket passes once the bucket is full and leaves it in debt, rather than never.
# KEYS[1]: the bucket; ARGV: capacity, tokens per second, cost. Returns the seconds to wait ("0": admitted).
TOKEN_BUCKET = """
local capacity, rate, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
local needed = math.min(cost, capacity)
local wait = 0
if tokens >= needed then tokens = tokens - cost else wait = (needed - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil((capacity - tokens) / rate) + 1)
return tostring(wait)
"""


@lru_cache
def _bucket_script(redis_url: str) -> Script:
    return redis_client(redis_url).register_script(TOKEN_BUCKET)


def caller(request: Request) -> str:
    """Whose bucket: the request's API key, else (auth off) its client address."""
    key = getattr(request.state, "api_key", None)
    if key is not None:
        return f"key:{key.id}"
    return f"address:{request.client.host if request.client else 'unknown'}"


def charge(request: Request, quota: Quota, cost: int) -> None:
    """Take ``cost`` from the caller's ``quota`` bucket, or answer 429 with the seconds until it would fit."""
    settings = get_settings()
    capacity: int = getattr(settings, f"quota_{quota}")
    if not capacity:
        return
    rate = capacity / settings.quota_window_s
    bucket = f"kernelzero:quota:{quota}:{caller(request)}"
    try:
        wait = float(_bucket_script(settings.redis_url)(keys=[bucket], args=[capacity, rate, cost]))
    except redis.RedisError as exc:  # the job could not be queued either: not ready, say why
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"the quota store (Redis) does not answer ({type(exc).__name__})",  # its text (host, port) is not the caller's
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    if wait > 0:
        retry_after = math.ceil(wait)
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"quota spent: {capacity} {quota.replace('_', ' ')} per {settings.quota_window_s:g} s for this key; "
            f"this request needs {cost}, retry in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )
