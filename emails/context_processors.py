"""Whether the demo signup page is open to this request (templates link to it only then)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def signup_open(request: HttpRequest) -> bool:
    """The page enqueues work: open in the demo (``CHASQUI_DEMO``) or to users allowed to enqueue jobs."""
    user = getattr(request, "user", None)
    return bool(settings.CHASQUI_DEMO or (user is not None and user.has_perm("chasqui_core.enqueue_jobs")))


def signup_demo(request: HttpRequest) -> dict[str, bool]:
    return {"signup_demo": signup_open(request)}
