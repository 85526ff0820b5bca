"""Console pages (GET). Changes are in ``actions``.

Reads go through the service layer with ``source="console"``, which checks
the view permission again and turns unknown queues and entries into
``NotFound`` (a 404 page, see ``guards``). Live numbers are not read here:
the counter history behind them (five minutes by the second, a day by the
minute, for every queue) cost a page 0.2-0.6 s before anything else was
read. A page draws placeholders with the ids of its live parts, and the
sampler's first fragment, sent as the page's socket opens (or its first
poll), fills them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from chasqui_core.engine.dlq.entries import DeadJob
from chasqui_core.engine.jobs.priority import job_priority
from chasqui_core.models import AuditEntry
from chasqui_core.engine.flows.refs import AFTER, FLOW
from chasqui_core.services import audit as audit_service
from chasqui_core.services import batches as batches_service
from chasqui_core.services import delayed as delayed_service
from chasqui_core.services import dlq as dlq_service
from chasqui_core.services import jobs as jobs_service
from chasqui_core.services import operations as operations_service
from chasqui_core.services import queues as queues_service
from chasqui_core.services import schedules as schedules_service
from chasqui_core.services import workers as workers_service
from chasqui_core.services.common import InvalidInput, NotFound, known_queues, require_queue

from . import fragments
from .forms import DLQFilterForm, ReplayOptionsForm, describe_filter
from .guards import console_page
from .readings import RATE_SECONDS
from .sampler import get_sampler
from .topics import BadTopic, Topic

DLQ_PAGE_SIZE = 50
DELAYED_PAGE_SIZE = 25
STREAM_PAGE_SIZE = 50


def _live(topic: Topic) -> dict[str, Any]:
    return {"topic": topic, "live_ws": topic.ws_url, "live_poll": reverse("chasqui_console:live", args=[topic.path])}


def _base(request: HttpRequest, section: str, queue: str | None = None) -> dict[str, Any]:
    return {"nav_queues": known_queues(), "section": section, "current_queue": queue}


# --- overview and queue ---------------------------------------------------------------


@console_page
def overview(request: HttpRequest) -> HttpResponse:
    topic = Topic("overview")
    ctx = {**_base(request, "overview"), **_live(topic), "rate_seconds": RATE_SECONDS, **_all_history(request)}
    return render(request, "chasqui_console/overview.html", ctx)


@console_page
def queue(request: HttpRequest, name: str) -> HttpResponse:
    name = require_queue(name)
    topic = Topic("queue", name)
    cursor = request.GET.get("after") or None
    delayed_error = ""
    try:
        delayed = delayed_service.delayed_page(request.user, name, cursor=cursor, limit=DELAYED_PAGE_SIZE,
                                               source="console")
    except InvalidInput as exc:
        delayed_error, cursor = str(exc), None
        delayed = delayed_service.delayed_page(request.user, name, limit=DELAYED_PAGE_SIZE, source="console")
    ctx = {
        **_base(request, "queue", name), **_live(topic),
        "q": queues_service.queue_detail(request.user, name, source="console"), "now_ms": int(time.time() * 1000),
        "delayed": delayed, "delayed_error": delayed_error, "delayed_cursor": cursor,
        "limits": queues_service.queue_limits(request.user, name, source="console"),
        **_history(request, name),
    }
    return render(request, "chasqui_console/queue.html", ctx)


def _range(request: HttpRequest) -> str:
    chosen = request.GET.get("range") or "1h"
    return chosen if chosen in dict(fragments.RANGE_CHOICES) else "1h"


def _history(request: HttpRequest, name: str) -> dict[str, Any]:
    return fragments.history_context(queues_service.queue_history(request.user, name, range=_range(request),
                                                                  source="console"))


def _all_history(request: HttpRequest) -> dict[str, Any]:
    try:
        window = queues_service.all_history(request.user, range=_range(request), source="console")
    except InvalidInput:  # no queue yet: the overview says so already
        return {}
    return fragments.history_context(window)


@console_page
def overview_history(request: HttpRequest) -> HttpResponse:
    """The overview's history panel (every queue) for one time range: what its range picker swaps in."""
    ctx = _all_history(request)
    if not ctx:
        return HttpResponse("")
    return render(request, "chasqui_console/parts/history.html", {**_base(request, "overview"), **ctx})


@console_page
def history(request: HttpRequest, name: str) -> HttpResponse:
    """A queue's history panel for one time range: what the range picker swaps in (or a page of its own)."""
    name = require_queue(name)
    ctx = {**_base(request, "queue", name), "q_name": name, **_history(request, name)}
    return render(request, "chasqui_console/parts/history.html", ctx)


# --- the dead-letter queue ----------------------------------------------------------------


def _task_names(request: HttpRequest) -> list[str]:
    return [t.name for t in jobs_service.task_list(request.user, source="console")]


@dataclass(frozen=True, slots=True)
class FilterChip:
    """One active DLQ filter as shown above the entries, with the link that drops it."""

    key: str
    label: str
    value: str
    remove_url: str


def filter_chips(request: HttpRequest, name: str, params: dict[str, str]) -> list[FilterChip]:
    """A chip per active filter; its link is the same view without that filter (and back at the newest page)."""
    base = reverse("chasqui_console:dlq", args=[name])
    chips = []
    for key, (label, value) in zip(params, describe_filter(params), strict=False):
        query = request.GET.copy()
        for dropped in (key, "cursor"):
            query.pop(dropped, None)
        chips.append(FilterChip(key, label, value, f"{base}?{query.urlencode()}" if query else base))
    return chips


@console_page
def dlq(request: HttpRequest, name: str) -> HttpResponse:
    name = require_queue(name)
    topic = Topic("dlq", name)
    form = DLQFilterForm(request.GET)
    valid = form.is_valid()
    params = form.params()
    view = "groups" if request.GET.get("view") == "groups" and not form.fingerprint else "list"
    cursor = request.GET.get("cursor") or None
    page = groups = grouping = None
    error = ""
    if valid:
        try:
            if view == "groups":
                grouping = dlq_service.dlq_grouping(request.user, name, filter=form.dlq_filter, source="console")
                groups = grouping.groups
            else:
                page = dlq_service.dlq_page(request.user, name, filter=form.dlq_filter, cursor=cursor,
                                            limit=DLQ_PAGE_SIZE, source="console")
        except InvalidInput as exc:
            error = str(exc)
    ctx = {
        **_base(request, "dlq", name), **_live(topic), "q": queues_service.queue_detail(request.user, name,
                                                                                         source="console"),
        "retention": dlq_service.dlq_retention(request.user, name, source="console"),
        "form": form, "filter_params": params, "filtered": bool(params),
        "view": view, "page": page, "groups": groups, "grouping": grouping, "error": error, "cursor": cursor,
        "tasks": _task_names(request), "filter_chips": filter_chips(request, name, params),
    }
    return render(request, "chasqui_console/dlq.html", ctx)


@console_page
def dlq_search(request: HttpRequest, name: str) -> HttpResponse:
    """Free-text search over the whole DLQ: the page holds the list; ``dlq_search_more`` fills it chunk by chunk."""
    name = require_queue(name)
    text = request.GET.get("q", "").strip()[:200]
    ctx = {**_base(request, "dlq", name), "queue": name, "text": text}
    return render(request, "chasqui_console/dlq_search.html", ctx)


def _count_param(request: HttpRequest, name: str) -> int:
    value = request.GET.get(name, "")
    return int(value) if value.isdigit() else 0


@console_page
def dlq_search_more(request: HttpRequest, name: str) -> HttpResponse:
    """The next matches of a search (about half a second of reading), with the progress and where to go on."""
    name = require_queue(name)
    text = request.GET.get("q", "").strip()[:200]
    ctx: dict[str, Any] = {"queue": name, "text": text, "items": [], "error": ""}
    try:
        page = dlq_service.dlq_search(request.user, name, text, cursor=request.GET.get("cursor") or None,
                                      limit=DLQ_PAGE_SIZE, source="console")
    except InvalidInput as exc:
        ctx["error"] = str(exc)
        return render(request, "chasqui_console/parts/dlq_search_rows.html", ctx)
    scanned = _count_param(request, "scanned") + page.scanned
    found = _count_param(request, "found") + len(page.items)
    ctx.update(items=page.items, next_cursor=page.next_cursor, scanned=scanned, found=found,
               total=max(page.total, scanned), percent=min(100, scanned * 100 // page.total) if page.total else 100)
    response = render(request, "chasqui_console/parts/dlq_search_rows.html", ctx)
    response["Cache-Control"] = "no-store"
    return response


@dataclass(frozen=True, slots=True)
class Run:
    """One failed run of a job, from its error history."""

    number: int
    record: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Generation:
    """The runs between two replays: the first is the original, then one per replay seen."""

    label: str
    runs: list[Run]


def generations(dead: DeadJob | list[Any]) -> list[Generation]:
    """Split the error history where a replay started the attempt count again.

    A replay that reset the budget restarts the attempt numbers, and a run
    lost with its worker carries the replay count it died in; a replay that
    granted one more attempt continues the numbering and is not visible here
    (the job's ``replays`` count still says it happened).
    """
    out: list[list[Run]] = [[]]
    previous_attempt = None
    previous_replays = None
    errors = dead if isinstance(dead, list) else dead.errors
    for i, record in enumerate(errors):
        if not isinstance(record, dict):
            continue
        attempt = record.get("attempt")
        replays = record.get("replays")
        new = False
        if isinstance(attempt, int) and isinstance(previous_attempt, int) and attempt <= previous_attempt:
            new = True
        if isinstance(replays, int) and isinstance(previous_replays, int) and replays > previous_replays:
            new = True
        if new and out[-1]:
            out.append([])
        out[-1].append(Run(i + 1, record))
        previous_attempt = attempt if isinstance(attempt, int) else previous_attempt
        previous_replays = replays if isinstance(replays, int) else previous_replays
    return [Generation("Original runs" if n == 0 else f"After replay {n}", runs) for n, runs in enumerate(out) if runs]


@console_page
def entry(request: HttpRequest, name: str, entry_id: str) -> HttpResponse:
    name = require_queue(name)
    try:
        dead = dlq_service.dlq_entry(request.user, name, entry_id, source="console")
    except InvalidInput as exc:
        raise NotFound(str(exc)) from None
    ctx = {
        **_base(request, "dlq", name), "dead": dead, "job": dead.job, "generations": generations(dead),
        "replay_form": ReplayOptionsForm(),
    }
    return render(request, "chasqui_console/entry.html", ctx)


# --- any job, by id --------------------------------------------------------------------------


@console_page
def search(request: HttpRequest) -> HttpResponse:
    """The header's search box: straight to the job's page (which says where it looked when it finds nothing)."""
    job_id = request.GET.get("id", "").strip()
    if not job_id:
        return render(request, "chasqui_console/search.html", {**_base(request, "search"), "job_id": ""})
    return HttpResponseRedirect(reverse("chasqui_console:job", args=[job_id]))


@console_page
def job(request: HttpRequest, job_id: str) -> HttpResponse:
    """One job in whatever state it is, with the actions that fit that state."""
    try:  # where the id leads first (milliseconds at any size); every stream and delayed set when asked
        found = jobs_service.find_job(request.user, job_id, source="console", wide=request.GET.get("search") == "all")
    except (NotFound, InvalidInput) as exc:
        ctx = {**_base(request, "search"), "job_id": job_id, "message": str(exc),
               "search_all": isinstance(exc, jobs_service.NotFoundNearby)}
        return render(request, "chasqui_console/search.html", ctx, status=404)
    result = found.result or {}
    errors = found.dead.errors if found.dead is not None else (
        found.job.errors if found.job is not None else list(result.get("errors") or []))
    envelope = found.job or (found.dead.job if found.dead is not None else None)
    ctx = {
        **_base(request, "search", found.queue), "found": found, "job": found.job, "dead": found.dead,
        "flow": envelope.meta.get(FLOW) or envelope.meta.get(AFTER) if envelope is not None else None,
        "result": result, "errors": errors, "generations": generations([e for e in errors if isinstance(e, dict)]),
        "replay_form": ReplayOptionsForm(), "here": request.get_full_path(),
        "live": found.state in ("waiting", "running", "delayed"),
        "priority": job_priority(found.job.meta) if found.job is not None else 0,
    }
    if request.htmx:  # the page's live part: state, progress and a pending cancel, polled while the job is live
        return render(request, "chasqui_console/parts/job_live.html", ctx)
    return render(request, "chasqui_console/job.html", ctx)


@console_page
def batch(request: HttpRequest, batch_id: str) -> HttpResponse:
    """A workflow's batch or chain: progress, counts by state, callbacks and their jobs, its children."""
    try:
        status = batches_service.get_batch(request.user, batch_id, source="console")
    except (NotFound, InvalidInput) as exc:
        ctx = {**_base(request, "search"), "job_id": batch_id, "message": str(exc)}
        return render(request, "chasqui_console/search.html", ctx, status=404)
    ctx = {**_base(request, "search", batch_id.partition(":")[0]), **_live(Topic("batch", batch_id)),
           **fragments.batch_context(status)}
    return render(request, "chasqui_console/batch.html", ctx)


@console_page
def stream(request: HttpRequest, name: str) -> HttpResponse:
    """The jobs in a queue's streams, highest priority band first, each newest or oldest first, each linking to
    its page."""
    name = require_queue(name)
    order = "oldest" if request.GET.get("order") == "oldest" else "newest"
    cursor = request.GET.get("cursor") or None
    error = ""
    try:
        page = queues_service.stream_page(request.user, name, cursor=cursor, limit=STREAM_PAGE_SIZE,
                                          newest_first=order == "newest", source="console")
    except InvalidInput as exc:
        error, cursor = str(exc), None
        page = queues_service.stream_page(request.user, name, limit=STREAM_PAGE_SIZE,
                                          newest_first=order == "newest", source="console")
    ctx = {**_base(request, "stream", name), "queue": name, "page": page, "order": order, "cursor": cursor,
           "error": error}
    return render(request, "chasqui_console/stream.html", ctx)


# --- operations, audit -----------------------------------------------------------------------


@console_page
def operation(request: HttpRequest, op_id: str) -> HttpResponse:
    op = operations_service.get_operation(request.user, op_id, source="console")
    topic = Topic("operation", str(op.pk))
    ctx = {**_base(request, "dlq", op.queue), **_live(topic), **fragments.operation_context(op),
           "filter_summary": describe_filter(op.filter or {})}
    return render(request, "chasqui_console/operation.html", ctx)


@console_page
def audit(request: HttpRequest) -> HttpResponse:
    action = request.GET.get("action") or None
    queue_name = request.GET.get("queue") or None
    source = request.GET.get("source") or None
    cursor = request.GET.get("cursor") or None
    error = ""
    try:
        log = audit_service.audit_log(request.user, action=action, queue=queue_name, source_filter=source,
                                      cursor=cursor, limit=50, source="console")
    except InvalidInput as exc:
        error = str(exc)
        log = audit_service.audit_log(request.user, limit=50, source="console")
    operations = operations_service.list_operations(request.user, limit=10, source="console")
    ctx = {
        **_base(request, "audit"), "log": log, "error": error, "operations": operations,
        "actions": AuditEntry.Action.choices, "sources": AuditEntry.Source.choices,
        "selected": {"action": action or "", "queue": queue_name or "", "source": source or ""},
    }
    return render(request, "chasqui_console/audit.html", ctx)


@console_page
def schedules(request: HttpRequest) -> HttpResponse:
    """Every schedule with its next fire and how its recent fires went; htmx refreshes the table."""
    error = ""
    try:
        items = schedules_service.schedule_list(request.user, source="console")
    except InvalidInput as exc:  # the settings' schedules are wrong: say so instead of failing the page
        items, error = [], str(exc)
    ctx = {**_base(request, "schedules"), "schedules": items, "error": error, "now": timezone.now()}
    if request.htmx:
        return render(request, "chasqui_console/parts/schedules_table.html", ctx)
    return render(request, "chasqui_console/schedules.html", ctx)


# --- live fragments over plain HTTP (the websocket fallback) -------------------------------------


@console_page
def live(request: HttpRequest, topic: str) -> HttpResponse:
    """The fragment a websocket would push, for tabs that cannot keep a websocket open."""
    try:
        parsed = Topic.parse(topic)
    except BadTopic as exc:
        raise Http404(str(exc)) from None
    if parsed.queue:
        require_queue(parsed.queue)
    elif parsed.kind == "operation":
        operations_service.get_operation(request.user, parsed.arg, source="console")
    html = get_sampler().render([parsed])[parsed]
    response = HttpResponse(html)
    response["Cache-Control"] = "no-store"
    return response


# --- workers ------------------------------------------------------------------------------------

WORKER_RUNS_PAGE_SIZE = 50


@console_page
def workers(request: HttpRequest) -> HttpResponse:
    """Every worker with its state, queues, host and runs; quiet and stop for operators. htmx refreshes it."""
    found = workers_service.worker_list(request.user, source="console")
    ctx = {**_base(request, "workers"), "workers": found, "now_ms": int(time.time() * 1000)}
    if request.htmx:
        return render(request, "chasqui_console/parts/worker_list.html", ctx)
    return render(request, "chasqui_console/workers.html", ctx)


@console_page
def worker(request: HttpRequest, worker_id: str) -> HttpResponse:
    """One worker and every job it runs now, paged (from its start journals), each linked to its job page."""
    try:
        offset = max(0, int(request.GET.get("offset") or 0))
    except ValueError:
        offset = 0
    info = workers_service.worker_detail(request.user, worker_id, source="console")
    runs = workers_service.worker_running(request.user, worker_id, offset=offset, limit=WORKER_RUNS_PAGE_SIZE,
                                          source="console")
    if offset and not runs.items and runs.total:  # the page emptied meanwhile: show the last one
        offset = (runs.total - 1) // WORKER_RUNS_PAGE_SIZE * WORKER_RUNS_PAGE_SIZE
        runs = workers_service.worker_running(request.user, worker_id, offset=offset,
                                              limit=WORKER_RUNS_PAGE_SIZE, source="console")
    ctx = {
        **_base(request, "workers"), "w": info, "runs": runs, "now_ms": int(time.time() * 1000),
        "prev_offset": max(0, offset - WORKER_RUNS_PAGE_SIZE) if offset else None,
        "next_offset": offset + WORKER_RUNS_PAGE_SIZE if offset + WORKER_RUNS_PAGE_SIZE < runs.total else None,
        "first_shown": offset + 1, "last_shown": offset + len(runs.items),
    }
    if request.htmx:
        return render(request, "chasqui_console/parts/worker_detail.html", ctx)
    return render(request, "chasqui_console/worker.html", ctx)
