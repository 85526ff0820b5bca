"""Tasks of the demo app.

``send_welcome_email`` can fail on purpose (``fail_rate``) with the kind of
temporary error a real SMTP server returns, so the demo shows retries.
"""

from __future__ import annotations

import logging
import random

from django.conf import settings
from django.core.mail import send_mail
from django.tasks import task

from emails.models import Signup

logger = logging.getLogger("chasqui.demo.emails")


@task(queue_name="emails", max_attempts=5)
def send_welcome_email(signup_id: int, *, fail_rate: float = 0.0) -> str:
    """Send the welcome email of one signup; return a short summary.

    Takes the row's id rather than the row: the task runs later, in another
    process, and must read the committed data, not a stale copy.
    """
    signup = Signup.objects.get(pk=signup_id)
    if random.random() < fail_rate:
        raise RuntimeError("SMTP server said 451: try again later")
    send_mail(
        subject="Welcome to Chasqui",
        message=(
            f"Hello {signup.email},\n\n"
            "Thanks for signing up. This email was sent by a background job.\n"
        ),
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[signup.email],
    )
    logger.info("Sent welcome email to %s (signup %s)", signup.email, signup_id)
    return f"welcome email sent to {signup.email}"


@task(queue_name="emails")
def signup_digest() -> str:
    """How many people have signed up: the demo's schedule (``make run`` fires it every minute)."""
    total = Signup.objects.count()
    logger.info("Signup digest: %d signup(s) so far", total)
    return f"{total} signup(s)"
