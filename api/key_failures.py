"""Wrong API keys, counted in Redis per client address and key prefix.

The count lives in Redis, not in Django's cache, so every web process (and
every server) shares one count whatever cache the project configures. It is
kept per address *and* per the first characters of the key sent
(``KEY_PREFIX_LENGTH``, the part of a key shown in lists): a script with a
revoked key is told to stop without the other keys used from the same
address, or from behind the same proxy, being touched.

The count never refuses a valid key: the key is looked up first, and only a
wrong one is counted, and answered 429 once its count is over the limit. The
limit does not make keys harder to guess (their 256 random bits do: no rate
a server answers at finds one); it tells a misconfigured client to back off,
with a ``Retry-After``, instead of letting it hammer the database for ever.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from chasqui_core.conf import key_failure_policy
from chasqui_core.models import KEY_PREFIX_LENGTH
from chasqui_core.services.common import redis_client

logger = logging.getLogger("chasqui.api")

KEY_PREFIX = "chasqui:api:key-failures:"


def failures_key(address: str, token: str) -> bytes:
    """The Redis key counting wrong keys from ``address`` that start like ``token``."""
    return f"{KEY_PREFIX}{address}:{token[:KEY_PREFIX_LENGTH]}".encode("utf-8", "surrogatepass")


def count_failure(address: str, token: str) -> int | None:
    """Count one wrong key; the seconds to wait when the count is over the limit, else None.

    The window starts at the first failure (EXPIRE NX), so a steady stream of
    wrong keys waits out one window, not a window that keeps moving. A Redis
    that cannot be reached counts nothing: the answer is then the plain 401
    a wrong key gets anyway.
    """
    policy = key_failure_policy()
    key = failures_key(address, token)
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, policy.window, nx=True)
        pipe.ttl(key)
        count, _, ttl = pipe.execute()
    except RedisError as exc:
        logger.warning("Could not count a wrong API key in Redis: %s", exc)
        return None
    if count <= policy.limit:
        return None
    return max(1, min(int(ttl), policy.window)) if ttl and ttl > 0 else policy.window
