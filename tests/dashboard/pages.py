"""What the console page tests share: the queue they use, a dead job, a logged-in client, and the live fragments
kept on the test's database connection (an autouse fixture: import it into a test module to apply it there).
"""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client

from chasqui_core.engine.jobs.envelope import Job
from chasqui_core.engine.store.keys import QueueKeys
from dashboard import sampler as sampler_mod

from tests.helpers import dead_job


Q = "emails"
KEYS = QueueKeys.for_queue(Q)
PAGES = ["/", f"/queues/{Q}/", f"/queues/{Q}/dlq/", f"/queues/{Q}/dlq/?view=groups", "/audit/",
         "/live/overview/", f"/live/queue/{Q}/", f"/live/dlq/{Q}/"]


def welcome_failure(**overrides) -> Job:
    """A welcome email the SMTP server kept refusing: the console's everyday dead job."""
    return dead_job(**{"task": "emails.tasks.send_welcome_email", "args": (1,), "messages": ("SMTP server said 451",),
                       "cls": "RuntimeError", **overrides})


def _client(user, **kwargs) -> Client:
    c = Client(**kwargs)
    c.force_login(user)
    return c


def _entries(html: str) -> list[str]:
    return re.findall(r'<tr data-entry="([^"]+)"', html)

@pytest.fixture(autouse=True)
def _live_fragments_keep_the_tests_connection(monkeypatch):
    """The live figures come from ``/live/<topic>/`` here. The sampler closes old database connections after
    rendering (it runs outside requests); the test client keeps the test's transaction on one connection across
    requests, as it does by disconnecting that call from the request signals."""
    monkeypatch.setattr(sampler_mod, "close_old_connections", lambda: None)


def _group_links(html: str) -> list[str]:
    """The "Entries" link of each group row, in table order."""
    return [unescape(h) for h in re.findall(r'<a class="button small secondary" href="([^"]+)">Entries</a>', html)]
