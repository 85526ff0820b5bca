"""The demo's signup page."""

from __future__ import annotations

from functools import partial

from django.contrib import messages
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from emails.context_processors import signup_open
from emails.forms import SignupForm
from emails.tasks import send_welcome_email


def signup(request: HttpRequest) -> HttpResponse:
    """Create a Signup and enqueue its welcome email.

    The job is enqueued with ``on_commit``: a worker may pick it up within
    milliseconds, and it must find the row. If the transaction rolls back, no
    email is queued at all.

    The page enqueues work, so it is open only in the demo (``make run`` sets
    ``CHASQUI_DEMO``) or to users allowed to enqueue jobs; anyone else gets 404.
    """
    if not signup_open(request):
        raise Http404("The demo signup page is off (set CHASQUI_DEMO=1, or log in as a user who may enqueue jobs)")
    if request.method == "POST":
        form = SignupForm(request.POST)
        if form.is_valid():
            with transaction.atomic():
                signup = form.save()
                transaction.on_commit(
                    partial(send_welcome_email.enqueue, signup.id, fail_rate=form.fail_rate)
                )
            messages.success(request, f"Thanks! A welcome email to {signup.email} is on its way.")
            return redirect("signup")
    else:
        form = SignupForm()
    return render(request, "emails/signup.html", {"form": form})
