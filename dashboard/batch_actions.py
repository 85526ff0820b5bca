"""Console changes to a workflow from its page: replay its dead children (a POST, CSRF-checked).

The service (services/batches.py) checks ``replay_jobs``, finds the children's
dead-letter entries and replays them through the DLQ's own replay, which
writes the audit entry; this view turns the outcome into a message.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from chasqui_core.services import batches as batches_service
from chasqui_core.services.common import InvalidInput, NotFound

from .actions import SOURCE, _back
from .guards import console_action


def _jobs(n: int) -> str:
    return "1 job" if n == 1 else f"{n:,} jobs"


@console_action
def batch_replay_dead(request: HttpRequest, batch_id: str) -> HttpResponse:
    """Replay every dead child of a batch (or dead step of a chain); say how many went back to work."""
    try:
        done = batches_service.replay_dead_children(request.user, batch_id, source=SOURCE)
    except (NotFound, InvalidInput) as exc:
        messages.error(request, str(exc))
    else:
        if not done.dead:
            messages.info(request, f"{batch_id} has no dead children to replay.")
        elif done.replayed == done.dead:
            messages.success(request, f"{_jobs(done.replayed)} of {batch_id} replayed: each runs again with its "
                                      "whole retry budget, and counts in the batch when it ends.")
        else:
            messages.warning(request, f"{_jobs(done.replayed)} of {batch_id} replayed; {done.dead - done.replayed} "
                                      "dead child(ren) were no longer in the dead-letter queue (replayed already, "
                                      "or trimmed by its retention).")
    return _back(request, reverse("chasqui_console:batch", args=[batch_id]))
