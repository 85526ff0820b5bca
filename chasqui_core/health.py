"""Can Chasqui do its work right now? The check behind ``/healthz``.

Two things must hold. Redis answers. And every queue that live workers serve
has a promoter leader: without one, delayed jobs and retries stay in the
delayed set for ever, while everything else looks fine. A leader may be
missing for a moment when the previous one stopped (its lock expires, another
worker takes it within a second), so a missing leader only fails the check
once it has been missing for longer than the lock's TTL. Redis cannot say
since when a key is absent, so each process remembers when it first saw the
leader missing.

A queue no live worker serves has no promoter by design; it is reported, not
failed (the ``chasqui_queue_workers_alive`` metric is the place to alert on it).

The check has a Redis client of its own, with short socket timeouts and no
retries: the shared client waits seconds and retries, and a probe must answer
in time even when the server hangs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from chasqui_core.conf import chasqui_settings
from chasqui_core.engine.ops import stats
from chasqui_core.engine.store.connection import connect, masked, server_of, undetected
from chasqui_core.engine.jobs.errors import RedisConfigError
from chasqui_core.engine.store.keys import QUEUES_REGISTRY, QueueKeys

SOCKET_TIMEOUT = 0.5
"""Seconds to connect, and to wait for each reply; two round trips keep a check under 2 s."""


@dataclass(frozen=True, slots=True)
class QueueHealth:
    workers: int
    """Workers with a fresh heartbeat on the queue."""
    leader: bool
    """A promoter holds the queue's lock."""
    leaderless_for_s: float
    """How long this process has seen the served queue without a leader (0 with one, or when nobody serves it)."""


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    problems: list[str]
    """Why the check failed, in words; empty when ok."""
    redis: str
    """"ok", or what went wrong talking to Redis."""
    queues: dict[str, QueueHealth]

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.ok else "unavailable",
            **({} if self.ok else {"reason": "; ".join(self.problems)}),
            "redis": self.redis,
            "queues": {name: {"workers": q.workers, "promoter_leader": q.leader,
                              "leaderless_for_s": round(q.leaderless_for_s, 1)} for name, q in self.queues.items()},
        }


class HealthCheck:
    """Checks one Redis server; keeps, per served queue, since when it has been seen without a leader."""

    def __init__(self, url: str, *, lock_ttl_ms: int, stale_after_ms: int = stats.DEFAULT_STALE_AFTER_MS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self._client: Any = None
        self.lock_ttl_ms = lock_ttl_ms
        self.stale_after_ms = stale_after_ms
        self.clock = clock
        self._leaderless_since: dict[str, float] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """Made on the first check that reaches the server: whether it is a cluster is asked then."""
        if self._client is None:
            client = connect(self.url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT,
                             retry=Retry(NoBackoff(), 0))
            if undetected(client):  # the server did not answer: this check fails, the next one asks again
                return client
            self._client = client
        return self._client

    def run(self) -> Health:
        try:
            all_keys = [QueueKeys.for_queue(name) for name in stats.list_queues(self.client)]
            pipe = self.client.pipeline(transaction=False)
            stats.add_clock_read(pipe, QUEUES_REGISTRY)
            for keys in all_keys:
                pipe.exists(keys.promoter_lock)
                pipe.hgetall(keys.workers)
            replies = pipe.execute()
        except (RedisError, RedisConfigError) as exc:
            where = server_of(self._client) if self._client is not None else masked(self.url)
            why = f"Redis at {where} did not answer: {type(exc).__name__}: {exc}"
            return Health(False, [why], why, {})
        now_ms = stats.server_ms(replies[0])
        seen_at = self.clock()
        queues: dict[str, QueueHealth] = {}
        problems: list[str] = []
        with self._lock:
            for i, keys in enumerate(all_keys):
                leader, beats = bool(replies[1 + 2 * i]), replies[2 + 2 * i]
                workers = len(stats.live_workers(beats, now_ms, self.stale_after_ms))
                missing_for = 0.0
                if leader or not workers:
                    self._leaderless_since.pop(keys.queue, None)
                else:
                    missing_for = seen_at - self._leaderless_since.setdefault(keys.queue, seen_at)
                    if missing_for * 1000 > self.lock_ttl_ms:
                        problems.append(
                            f"queue {keys.queue!r} has had no promoter leader for {missing_for:.1f} s "
                            f"(longer than the lock's {self.lock_ttl_ms} ms TTL) although {workers} worker(s) "
                            f"serve it: its delayed jobs and retries are not being moved")
                queues[keys.queue] = QueueHealth(workers, leader, missing_for)
        return Health(not problems, problems, "ok", queues)


_shared: dict[tuple[str, int], HealthCheck] = {}
_shared_lock = threading.Lock()


def check() -> Health:
    """Run the check of the configured server, with this process's memory of leaderless queues."""
    settings = chasqui_settings()
    key = (settings.redis_url, settings.PROMOTER_LOCK_TTL_MS)
    with _shared_lock:
        runner = _shared.get(key)
        if runner is None:
            runner = _shared[key] = HealthCheck(key[0], lock_ttl_ms=key[1])
    return runner.run()
