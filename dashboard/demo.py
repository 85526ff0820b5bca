"""Demo contents for an empty Redis: four queues with history, dead letters,
delayed jobs and workers, written the way the engine writes them.

Used by ``python -m dashboard.screenshots`` (the README pictures) and handy
for trying the console without producing real traffic. Counter history is
written straight into the engine's time buckets; dead letters carry full
envelopes with error histories, so every console page has something true to
show. Deterministic (seeded), so pictures only change when the console does.
"""

from __future__ import annotations

import math
import random
import socket

import msgpack

from chasqui_core.engine.jobs.envelope import Job, error_record
from chasqui_core.engine.store.keys import GROUP, QUEUES_REGISTRY, QueueKeys
from chasqui_core.engine.ops.metrics import MINUTE_BUCKET_TTL_S, SECOND_BUCKET_TTL_S
from chasqui_core.engine.producer.queue import Queue

from .readings import DEPTH_TTL


def _server_ms(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


QUEUES = {
    # name: (completed per second, retried per second, spike in the last seconds)
    "emails": (42.0, 0.6, False),
    "billing": (11.0, 0.4, True),
    "reports": (0.6, 0.02, False),
    "webhooks": (26.0, 1.2, False),
}

FAILURES = [
    ("billing", "billing.tasks.charge_invoice", "PaymentGatewayTimeout",
     "gateway did not answer within 10 s for invoice {n}", {"invoice_id": "{n}", "api_key": "sk_live_51Hx{n}"}),
    ("billing", "billing.tasks.charge_invoice", "CardDeclined",
     "card ending 4242 was declined (insufficient_funds) for customer {n}", {"invoice_id": "{n}"}),
    ("emails", "emails.tasks.send_welcome_email", "RuntimeError",
     "SMTP server said 451: try again later", {}),
    ("webhooks", "webhooks.tasks.deliver", "ConnectionError",
     "POST https://hooks.example.com/orders/{n} returned 503 Service Unavailable",
     {"url": "https://hooks.example.com/orders/{n}", "token": "whsec_{n}abcdef"}),
    ("reports", "reports.tasks.build_monthly_report", "KeyError", "'region'", {"month": "2025-10"}),
]


def _metrics(client, queue: str, now_ms: int, rng: random.Random) -> None:
    completed, retried, spike = QUEUES[queue]
    keys = QueueKeys.for_queue(queue)
    pipe = client.pipeline(transaction=False)
    now_s, now_m = now_ms // 1000, now_ms // 60_000
    # From five minutes ago to two minutes ahead, so the picture stays live while it is taken.
    for offset in range(-300, 121):
        sec = now_s + offset
        spiking = spike and offset > -14
        wave = 1 + 0.25 * math.sin(sec / 23)
        done = max(0, int(rng.gauss(completed * wave, completed * 0.12)))
        retry_rate = retried * 30 if spiking else retried
        retries = max(0, int(rng.gauss(retry_rate, max(0.5, retry_rate * 0.3)))) if rng.random() < 0.9 else 0
        dead = 1 if rng.random() < (0.4 if spiking else 0.01) else 0
        key = f"{keys.second_counters}{sec}"
        fields = {"completed": done, "enqueued": done + retries // 3, "retried": retries, "failed": retries + dead,
                  "dlq": dead, "promoted": retries}
        _write(pipe, key, fields, SECOND_BUCKET_TTL_S)
    for back in range(1440, 0, -1):
        minute = now_m - back
        daily = 1 + 0.45 * math.sin((minute % 1440) / 1440 * 2 * math.pi)
        done = max(0, int(rng.gauss(completed * 60 * daily, completed * 6)))
        bump = 18 if 400 < back < 440 else 1
        retries = max(0, int(rng.gauss(retried * 60 * bump, retried * 20)))
        key = f"{keys.minute_counters}{minute}"
        fields = {"completed": done, "enqueued": done, "retried": retries, "failed": retries + (1 if bump > 1 else 0),
                  "dlq": 1 if rng.random() < 0.05 else 0, "promoted": retries}
        _write(pipe, key, fields, MINUTE_BUCKET_TTL_S)
    pipe.execute()


def _write(pipe, key: str, fields: dict[str, int], ttl: int) -> None:
    """A counter bucket as the Lua scripts leave it: only non-zero fields, with the bucket's TTL."""
    present = {k: v for k, v in fields.items() if v}
    if present:
        pipe.hset(key, mapping=present)
        pipe.expire(key, ttl)


def _dead_letters(client, now_ms: int, rng: random.Random) -> None:
    entries: list[tuple[int, str, dict]] = []
    for i in range(220):
        queue, task, cls, template, kwargs_template = FAILURES[0 if i % 3 == 0 else rng.randrange(len(FAILURES))]
        n = rng.randrange(10_000, 99_999)
        message = template.format(n=n)
        died = now_ms - int(rng.expovariate(1 / 3_600_000)) - 2000
        runs = 5 if cls != "KeyError" else 1
        module, function = task.rsplit(".", 1)
        module_file = module.replace(".", "/") + ".py"
        errors = [
            error_record(attempt=a + 1, exc_class=cls, message=message,
                         traceback=(f"Traceback (most recent call last):\n  File \"{module_file}\", "
                                    f"line {40 + a}, in {function}\n    result = client.call(payload)\n"
                                    f"{cls}: {message}\n"),
                         worker=f"{socket.gethostname()}:41{a}2:9f3c1a", started_at=died - (runs - a) * 4000,
                         finished_at=died - (runs - a) * 4000 + rng.randrange(40, 900))
            for a in range(runs)
        ]
        kwargs = {k: v.format(n=n) for k, v in kwargs_template.items()}
        job = Job(f"01JD{n:05d}{i:04d}DEMO{rng.randrange(10**9):09d}"[:26], task, [n], kwargs, attempt=runs,
                  created_at=died - runs * 5000, max_attempts=runs, errors=errors, replays=1 if i % 17 == 0 else 0)
        reason = "unrecoverable" if cls == "KeyError" else "retries_exhausted"
        fields = {"j": job.encode(), "reason": reason, "task": task, "job_id": job.id, "source_id": f"{died - 9000}-0",
                  "error_class": cls, "error": message}
        entries.append((died, queue, fields))
    entries.sort(key=lambda e: e[0])
    pipe = client.pipeline(transaction=False)
    seq: dict[tuple[str, int], int] = {}
    for died, queue, fields in entries:
        s = seq.get((queue, died), 0)
        seq[(queue, died)] = s + 1
        pipe.xadd(QueueKeys.for_queue(queue).dlq, fields, id=f"{died}-{s}")
    pipe.execute()


def _backlog(client, now_ms: int, rng: random.Random) -> None:
    emails = Queue("emails", redis_client=client)
    for i in range(140):
        emails.add("emails.tasks.send_welcome_email", [1000 + i])
    keys = QueueKeys.for_queue("emails")
    client.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    client.xreadgroup(GROUP, "demo-consumer", {keys.stream: ">"}, count=24)
    for i in range(12):  # password resets jump the queue; digests wait behind everything else
        emails.add("emails.tasks.send_password_reset", [2000 + i], priority=50)
    for i in range(8):
        emails.add("emails.tasks.send_weekly_digest", [3000 + i], priority=-10)
    billing = Queue("billing", redis_client=client)
    for i in range(380):
        billing.add("billing.tasks.charge_invoice", [50_000 + i], {"invoice_id": str(50_000 + i)},
                    delay=rng.randrange(1, 900) * 1000)
    webhooks = Queue("webhooks", redis_client=client)
    for i in range(45):
        webhooks.add("webhooks.tasks.deliver", [i], delay=rng.randrange(5, 120) * 1000)
    # Depth history for the last five minutes: retries piling up in billing.
    pipe = client.pipeline(transaction=False)
    now_s = now_ms // 1000
    for queue, final, base in (("billing", 380, 40), ("webhooks", 45, 30), ("emails", 0, 0), ("reports", 0, 0)):
        key = QueueKeys.for_queue(queue).console_depth
        members = {}
        for back in range(300, -60, -1):  # a minute ahead too: no gap while the pictures are taken
            share = min(1.0, (60 - back) / 60) if back < 60 else 0.0
            depth = int(base + (final - base) * share ** 1.6 + rng.randrange(0, 4)) if final else 0
            members[f"{now_s - back}:{depth}"] = now_s - back
        pipe.zadd(key, members)
        pipe.expire(key, DEPTH_TTL)
    pipe.execute()


WORKERS = [
    ("web-1", ["emails", "webhooks"], 20),
    ("web-2", ["emails", "webhooks"], 20),
    ("billing-1", ["billing"], 8),
    ("reports-1", ["reports"], 2),
]


def beat(client, started_ms: int) -> None:
    """Write fresh heartbeats for the demo workers (they go stale 10 s after the last one)."""
    now = _server_ms(client)
    pipe = client.pipeline(transaction=False)
    for i, (host, queues, concurrency) in enumerate(WORKERS):
        worker_id = f"{host}:{4100 + i}:{(i * 7919) % 65536:04x}"
        info = msgpack.packb({
            "id": worker_id, "host": host, "pid": 4100 + i, "queues": queues, "concurrency": concurrency,
            "in_flight": concurrency // 2 + i, "processed": 184_000 // (i + 1), "failed": 210 // (i + 1),
            "started_at": started_ms - (i + 1) * 3_600_000, "last_seen": now,
        })
        for queue in queues:
            pipe.hset(QueueKeys.for_queue(queue).workers, worker_id, info)
    pipe.execute()


def populate(client, seed: int = 7) -> int:
    """Fill an empty Redis with the demo; returns the server time used (ms)."""
    rng = random.Random(seed)
    now_ms = _server_ms(client)
    client.sadd(QUEUES_REGISTRY, *QUEUES)
    for queue in QUEUES:
        _metrics(client, queue, now_ms, rng)
    _dead_letters(client, now_ms, rng)
    _backlog(client, now_ms, rng)
    beat(client, now_ms)
    return now_ms
