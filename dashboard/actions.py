"""Console changes: every one a POST (CSRF-checked) that calls the service layer.

The service functions check the permission, do the work, and write the audit
entry (``source="console"``); these views only collect the operator's choices,
ask for confirmation where entries are about to be touched in bulk, and turn
the outcome into a message on the next page.
"""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from chasqui_core import access
from chasqui_core.models import Operation
from chasqui_core.services import delayed as delayed_service
from chasqui_core.services import dlq as dlq_service
from chasqui_core.services import batches as batches_service
from chasqui_core.services import jobs as jobs_service
from chasqui_core.services import operations as operations_service
from chasqui_core.services import queues as queues_service
from chasqui_core.services import schedules as schedules_service
from chasqui_core.services import workers as workers_service
from chasqui_core.services.common import Conflict, InvalidInput, NotFound, known_queues, require, require_queue

from .forms import BulkForm, DLQFilterForm, ReplayOptionsForm, describe_filter
from .guards import console_action

SOURCE = "console"


def _dlq_url(queue: str, params: dict[str, str] | None = None) -> str:
    url = reverse("chasqui_console:dlq", args=[queue])
    return f"{url}?{urlencode(params)}" if params else url


def _back(request: HttpRequest, fallback: str) -> HttpResponseRedirect:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                                  require_https=request.is_secure()):
        return HttpResponseRedirect(target)
    return HttpResponseRedirect(fallback)


def _entries(n: int) -> str:
    return "1 entry" if n == 1 else f"{n:,} entries"


# --- pause / resume -------------------------------------------------------------------


@console_action
def pause(request: HttpRequest, name: str) -> HttpResponse:
    changed = queues_service.pause(request.user, name, source=SOURCE)
    messages.success(request, f"Queue {name} is paused: workers stop reading it within a heartbeat. Nothing is lost."
                     if changed else f"Queue {name} was already paused.")
    return _back(request, reverse("chasqui_console:queue", args=[name]))


@console_action
def resume(request: HttpRequest, name: str) -> HttpResponse:
    changed = queues_service.resume(request.user, name, source=SOURCE)
    messages.success(request, f"Queue {name} is running again." if changed else f"Queue {name} was not paused.")
    return _back(request, reverse("chasqui_console:queue", args=[name]))


# --- schedules ----------------------------------------------------------------------------


@console_action
def schedule_pause(request: HttpRequest, name: str) -> HttpResponse:
    changed = schedules_service.pause(request.user, name, source=SOURCE)
    messages.success(request, f"Schedule {name} is paused: its due times pass without a job until it is resumed."
                     if changed else f"Schedule {name} was already paused.")
    return HttpResponseRedirect(reverse("chasqui_console:schedules"))


@console_action
def schedule_resume(request: HttpRequest, name: str) -> HttpResponse:
    changed = schedules_service.resume(request.user, name, source=SOURCE)
    messages.success(request, f"Schedule {name} fires again from its next due time." if changed
                     else f"Schedule {name} was not paused.")
    return HttpResponseRedirect(reverse("chasqui_console:schedules"))


@console_action
def schedule_run(request: HttpRequest, name: str) -> HttpResponse:
    fire = schedules_service.run_now(request.user, name, source=SOURCE)
    messages.success(request, f"Schedule {name}: job {fire.job_id} is on queue {fire.queue} now.")
    return HttpResponseRedirect(reverse("chasqui_console:schedules"))


# --- the delayed set ----------------------------------------------------------------------


@console_action
def delayed_run(request: HttpRequest, name: str) -> HttpResponse:
    job_id = request.POST.get("job_id", "")
    try:
        delayed_service.run_delayed_now(request.user, name, job_id, source=SOURCE)
        messages.success(request, f"Job {job_id} is on the queue now.")
    except (NotFound, InvalidInput) as exc:
        messages.error(request, str(exc))
    return _back(request, reverse("chasqui_console:queue", args=[name]))


@console_action
def delayed_cancel(request: HttpRequest, name: str) -> HttpResponse:
    """Remove a delayed job for good (the queue page's Cancel); the job's own page cancels through ``job_cancel``."""
    job_id = request.POST.get("job_id", "")
    queue_page = reverse("chasqui_console:queue", args=[name])
    try:
        delayed_service.cancel_delayed(request.user, name, job_id, source=SOURCE)
        messages.success(request, f"Delayed job {job_id} is cancelled: it will not run.")
    except (NotFound, InvalidInput) as exc:
        messages.error(request, str(exc))
        return _back(request, queue_page)
    if job_id and urlsplit(request.POST.get("next", "")).path == reverse("chasqui_console:job", args=[job_id]):
        # its page would answer "no job in any queue" (a 404), after searching every queue for it
        return HttpResponseRedirect(f"{queue_page}#delayed")
    return _back(request, queue_page)


# --- cancelling a job ----------------------------------------------------------------------------


@console_action
def job_cancel(request: HttpRequest, job_id: str) -> HttpResponse:
    try:
        done = jobs_service.cancel_job(request.user, job_id, source=SOURCE)
        how = {"waiting": "it will not run", "delayed": "it will not run",
               "running": "a worker stops it within a second (a sync task is told, and given up after its grace)"}
        messages.success(request, f"Job {job_id} is cancelled: {how[done.state]}. It goes to the dead-letter queue "
                                  "as cancelled.")
    except (NotFound, InvalidInput, Conflict) as exc:
        messages.error(request, str(exc))
    return _back(request, reverse("chasqui_console:job", args=[job_id]))


@console_action
def batch_cancel(request: HttpRequest, batch_id: str) -> HttpResponse:
    """Cancel a workflow's children that have not ended (services/batches.py)."""
    try:
        count = batches_service.cancel_batch(request.user, batch_id, source=SOURCE)
        messages.success(request, f"{count} job{'s' if count != 1 else ''} of {batch_id} cancelled: they go to the "
                                  "dead-letter queue as cancelled, which ends them in the batch.")
    except (NotFound, InvalidInput) as exc:
        messages.error(request, str(exc))
    return _back(request, reverse("chasqui_console:batch", args=[batch_id]))


# --- replay and discard ------------------------------------------------------------------------


def _require_action(request: HttpRequest, action: str) -> None:
    codename = access.REPLAY if action == "replay" else access.DISCARD
    require(request.user, codename, SOURCE)


@console_action
def confirm(request: HttpRequest, name: str) -> HttpResponse:
    """Say exactly how many entries a bulk action would touch, and ask to go ahead."""
    name = require_queue(name)
    bulk = BulkForm(request.POST)
    filters = DLQFilterForm(request.POST)
    if not filters.is_valid():
        messages.error(request, " ".join(str(e) for errs in filters.errors.values() for e in errs))
        return HttpResponseRedirect(_dlq_url(name))
    params = filters.params()
    if not bulk.is_valid():
        for errs in bulk.errors.values():
            for e in errs:
                messages.error(request, str(e))
        return HttpResponseRedirect(_dlq_url(name, params))
    _require_action(request, bulk.action)
    ids = bulk.cleaned_data.get("ids") or []
    if bulk.scope == "matching":
        try:
            estimate = dlq_service.dlq_estimate(request.user, name, filter=filters.dlq_filter, source=SOURCE)
        except InvalidInput as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(_dlq_url(name, params))
        count, approximate = estimate.count, not estimate.exact
    else:
        count, approximate = len(set(ids)), False
    ctx = {
        "nav_queues": known_queues(), "section": "dlq", "current_queue": name,
        "queue": name, "action": bulk.action, "scope": bulk.scope, "ids": ids, "count": count,
        "filter_params": params, "filter_summary": describe_filter(params),
        "replay_form": ReplayOptionsForm(), "back": _dlq_url(name, params),
        "approximate": approximate,
        "background": bulk.scope == "matching" and (approximate or count > dlq_service.background_threshold()),
    }
    return render(request, "chasqui_console/confirm.html", ctx)


@console_action
def bulk(request: HttpRequest, name: str, action: str) -> HttpResponse:
    """Carry out a confirmed replay or discard (ticked ids, or everything matching the filter)."""
    name = require_queue(name)
    _require_action(request, action)
    filters = DLQFilterForm(request.POST)
    params = filters.params() if filters.is_valid() else {}
    back = _dlq_url(name, params)
    scope = request.POST.get("scope", "selected")
    options = ReplayOptionsForm(request.POST) if action == "replay" else None
    if options is not None and not options.is_valid():
        messages.error(request, " ".join(str(e) for errs in options.errors.values() for e in errs))
        return HttpResponseRedirect(back)
    if not filters.is_valid():
        messages.error(request, "The filter is not valid any more: nothing was changed.")
        return HttpResponseRedirect(back)

    ids: list[str] | None = None
    f = None
    if scope == "matching":
        f = filters.dlq_filter
    else:
        ids = request.POST.getlist("ids")
        if not ids:
            messages.error(request, "No entry was ticked: nothing was changed.")
            return HttpResponseRedirect(back)

    try:
        if action == "replay":
            assert options is not None
            result = dlq_service.replay(request.user, name, ids=ids, filter=f, reset_attempts=options.reset_attempts,
                                        run_at=options.cleaned_data.get("run_at"), source=SOURCE,
                                        rate=options.cleaned_data.get("rate") if scope == "matching" else None)
        else:
            result = dlq_service.discard(request.user, name, ids=ids, filter=f, source=SOURCE)
    except (InvalidInput, Conflict) as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(back)

    if isinstance(result, Operation):
        messages.info(request, f"The {action} runs in the background; you can leave this page.")
        return HttpResponseRedirect(reverse("chasqui_console:operation", args=[result.pk]))
    if action == "replay":
        when = options.cleaned_data.get("run_at") if options is not None else None
        where = f"scheduled for {when:%Y-%m-%d %H:%M} UTC" if when else "back on the queue"
        messages.success(request, f"Replayed {_entries(result)}: "
                                  f"{'it is' if result == 1 else 'they are'} {where}.")
    else:
        messages.success(request, f"Discarded {_entries(result)} for good.")
    requested = len(ids) if ids is not None else None
    if requested is not None and result < requested:
        messages.info(request, f"{requested - result:,} of the chosen entries were already gone "
                               "(replayed or discarded by someone else) or cannot be decoded.")
    return HttpResponseRedirect(back)


@console_action
def entry_replay(request: HttpRequest, name: str, entry_id: str) -> HttpResponse:
    options = ReplayOptionsForm(request.POST)
    entry_url = reverse("chasqui_console:entry", args=[name, entry_id])
    if not options.is_valid():
        messages.error(request, " ".join(str(e) for errs in options.errors.values() for e in errs))
        return HttpResponseRedirect(entry_url)
    try:
        count = dlq_service.replay(request.user, name, ids=[entry_id], reset_attempts=options.reset_attempts,
                                   run_at=options.cleaned_data.get("run_at"), source=SOURCE)
    except InvalidInput as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(entry_url)
    if count:
        when = options.cleaned_data.get("run_at")
        messages.success(request, f"Entry {entry_id} replayed: the job is "
                                  f"{f'scheduled for {when:%Y-%m-%d %H:%M} UTC' if when else 'back on the queue'}.")
    else:
        messages.info(request, f"Entry {entry_id} was not replayed: it is already gone, or its payload cannot be "
                               "decoded.")
    return _back(request, _dlq_url(name))


# --- background operations ------------------------------------------------------------------------


@console_action
def operation_cancel(request: HttpRequest, op_id: str) -> HttpResponse:
    try:
        op = operations_service.cancel_operation(request.user, op_id, source=SOURCE)
        messages.success(request, f"Stopping the {op.kind} after its current chunk; what is done stays done.")
    except Conflict as exc:
        messages.info(request, str(exc))
    return HttpResponseRedirect(reverse("chasqui_console:operation", args=[op_id]))


# --- workers: quiet and stop ------------------------------------------------------------------


@console_action
def worker_quiet(request: HttpRequest, worker_id: str) -> HttpResponse:
    sent = workers_service.quiet(request.user, worker_id, source=SOURCE)
    messages.success(request, f"Worker {worker_id} is asked to quiet down: within a second or two it takes no more "
                              "jobs, hands back those it had not started, and finishes the ones it runs."
                     if sent.changed else f"Worker {worker_id} had been asked already.")
    return _back(request, reverse("chasqui_console:worker", args=[worker_id]))


@console_action
def worker_stop(request: HttpRequest, worker_id: str) -> HttpResponse:
    sent = workers_service.stop(request.user, worker_id, source=SOURCE)
    replaced = " Its supervisor does not start another in its place." if sent.worker.supervisor_pid else ""
    messages.success(request, f"Worker {worker_id} is asked to stop: it finishes its running jobs, hands back the "
                              f"rest and exits.{replaced}" if sent.changed
                     else f"Worker {worker_id} had been asked to stop already.")
    return _back(request, reverse("chasqui_console:workers"))


# --- queue housekeeping: purge ------------------------------------------------------------------


@console_action
def purge_confirm(request: HttpRequest, name: str) -> HttpResponse:
    """Say how many waiting jobs a purge would delete, and ask to go ahead."""
    name = require_queue(name)
    require(request.user, access.DISCARD, SOURCE)
    by_band = queues_service.waiting_by_band(request.user, name, source=SOURCE)
    count = sum(by_band.values())
    bands = by_band if by_band["high"] or by_band["low"] else {}  # a queue without prioritised jobs: one figure
    ctx = {"nav_queues": known_queues(), "section": "queue", "current_queue": name, "queue": name, "count": count,
           "bands": bands, "back": reverse("chasqui_console:queue", args=[name])}
    return render(request, "chasqui_console/purge_confirm.html", ctx)


@console_action
def purge(request: HttpRequest, name: str) -> HttpResponse:
    """Carry out a confirmed purge of a queue's waiting jobs."""
    name = require_queue(name)
    deleted = queues_service.purge(request.user, name, source=SOURCE)
    if deleted:
        messages.success(request, f"Deleted {deleted:,} waiting job{'s' if deleted != 1 else ''} from {name}. "
                                  "Jobs a worker held are running or about to, as before.")
    else:
        messages.info(request, f"Queue {name} had no waiting jobs: nothing was deleted.")
    return HttpResponseRedirect(reverse("chasqui_console:queue", args=[name]))
