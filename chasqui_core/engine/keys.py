"""Where a queue lives in Redis.

Every key of a queue carries the hash tag ``{chasqui:<queue>}``, so all of a
queue's keys fall in one Redis Cluster slot and each Lua script touches one
slot only. Counters are bucketed by time under the same tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidQueueName

GROUP = "chasqui"
"""The consumer group every worker of a queue joins."""

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


def validate_queue_name(name: str) -> str:
    if not isinstance(name, str) or not _QUEUE_NAME.match(name):
        raise InvalidQueueName(
            f"Queue name {name!r} is not valid: use 1 to 100 letters, digits, '_', '-' or '.'"
        )
    return name


@dataclass(frozen=True, slots=True)
class QueueKeys:
    queue: str
    prefix: str
    stream: str
    delayed: str
    dlq: str
    events: str
    promoter_lock: str
    workers: str
    paused: str
    unique: str
    """Prefix of the idempotency markers written for adds with a caller-given job id."""
    result: str
    """Prefix of stored results (when result storage is on)."""
    metrics: str
    """Prefix of the time-bucketed counters: ``<metrics>s:<epoch second>`` and ``<metrics>m:<epoch minute>``."""
    totals: str
    """All-time counters (``<metrics>total``): the Lua scripts build this name from the metrics prefix."""
    durations: str
    """Run-duration histogram per task (``<metrics>durations``), built by settle.lua from the same prefix."""
    lane: str
    """Prefix of the producer lanes: ``<lane><lane id>`` holds the last write of one lane (see engine/link.py)."""

    @classmethod
    def for_queue(cls, queue: str) -> "QueueKeys":
        validate_queue_name(queue)
        p = f"{{chasqui:{queue}}}:"
        return cls(
            queue=queue,
            prefix=p,
            stream=p + "stream",
            delayed=p + "delayed",
            dlq=p + "dlq",
            events=p + "events",
            promoter_lock=p + "promoter:lock",
            workers=p + "workers",
            paused=p + "paused",
            unique=p + "unique:",
            result=p + "result:",
            metrics=p + "m:",
            totals=p + "m:total",
            durations=p + "m:durations",
            lane=p + "lane:",
        )


QUEUES_REGISTRY = "chasqui:queues"
"""A set of every queue name ever used, so operators can list queues without SCAN."""
