"""The console's pages, server time: what a request costs before the browser sees a byte.

Issue 39 found every page with live figures paying 0.2-0.4 s on a loaded host
for the figures' first paint (the counter history read and the charts drawn
on the request path). This module times the overview, a queue's page and its
dead letters through Django's test client (a logged-in operator, the
project's middleware, templates and database), against a private Valkey
holding ``--queues`` queues with jobs in every state and a small DLQ.

Each page is timed twice over: *cold*, with a fresh console reader (a server
process that just started, or another process of several), and *warm*, with
the reader kept between requests (one process serving one tab). The median and
worst of ``--repeats`` requests are printed.

Run it with ``python -m bench.console_pages``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

QUEUE_PREFIX = "bench-pages"


def _setup_django(url: str, db_dir: str) -> None:
    os.environ["REDIS_URL"] = url
    os.environ["DATABASE_URL"] = f"sqlite:///{db_dir}/db.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.django_settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def _fill(client, queues: list[str]) -> None:
    """Jobs waiting, delayed and dead in each queue, through the engine's own paths."""
    from chasqui_core.engine.producer.queue import Queue

    from .console_scale import build_dead

    for name in queues:
        q = Queue(name, redis_client=client)
        for i in range(50):
            q.add("bench.pages.task", args=[i])
        for i in range(50):
            q.add("bench.pages.task", args=[i], delay=3600)
        build_dead(client, name, 200)


def _timed(call: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        out.append((time.perf_counter() - started) * 1000)
    return out


def measure(url: str, *, queues: int = 8, repeats: int = 20) -> list[tuple[str, float, float]]:
    """(page and case, median ms, worst ms) for each page, cold and warm."""
    with tempfile.TemporaryDirectory() as db_dir:
        _setup_django(url, db_dir)
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group
        from django.test import Client

        from chasqui_core import access
        from chasqui_core.services.common import redis_client
        from dashboard import sampler as sampler_mod

        names = [f"{QUEUE_PREFIX}-{i}" for i in range(queues)]
        _fill(redis_client(), names)
        user = get_user_model().objects.create_user("bench-operator", password="x")
        user.groups.add(Group.objects.get(name=access.OPERATORS))
        web = Client()
        web.force_login(user)
        pages = {"overview": "/", "queue": f"/queues/{names[0]}/", "dlq": f"/queues/{names[0]}/dlq/"}
        rows = []
        for label, path in pages.items():
            def get(path: str = path) -> None:
                response = web.get(path)
                assert response.status_code == 200, (path, response.status_code)

            def cold(get: Callable[[], None] = get) -> None:
                sampler_mod.get_sampler()._reader = None  # a server process that has not read yet
                get()

            get()
            for case, call in (("cold", cold), ("warm", get)):
                times = _timed(call, repeats)
                rows.append((f"{label} ({case})", statistics.median(times), max(times)))
        return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    from .server import BenchServer

    with BenchServer() as server:
        for case, median, worst in measure(server.url, queues=args.queues, repeats=args.repeats):
            print(f"{case:<18} median {median:7.1f} ms   worst {worst:7.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
