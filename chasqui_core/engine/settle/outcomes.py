"""What each fetched job came to, written down: success, retry, dead letter, requeue.

This is the one place that answers "where is a retry written": the worker
runs a handler and hands the outcome here; ``retry.decide`` says whether the
job has runs left and how long to wait; this module builds what Redis must
hold afterwards (the job's envelope with its new error record, the result
record for ``get_result()``) and queues it on the settler, which writes a
batch of outcomes per queue with one ``settle.lua`` call. Entries refused
before they run (undecodable, oversize, a bad signature, unknown task, poison
pill) are dead-lettered here too, and jobs whose idempotency key has already
completed are acknowledged without running.

Recording an outcome can itself fail (a user's backoff strategy returning
None, a return value msgpack refuses): such a job goes to the DLQ as
``internal``, with what went wrong, and nothing else is affected.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgpack

from chasqui_core.engine.flows.refs import FLOW
from chasqui_core.engine.ops.cancel import describe as cancel_words
from chasqui_core.engine.jobs.envelope import Job, error_record, now_ms
from chasqui_core.engine.jobs.errors import JobCancelled
from chasqui_core.engine.jobs.idempotency import ttl_ms
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.log_budget import LogBudget
from chasqui_core.engine.jobs.results import encode_result
from chasqui_core.engine.settle.retry import Decision, RetryPolicy, decide
from chasqui_core.engine.settle.settler import Settler
from chasqui_core.engine.jobs.tracebacks import class_path, describe, message

if TYPE_CHECKING:
    from chasqui_core.engine.worker.delivery import Delivery

logger = logging.getLogger("chasqui.worker")

_packb = msgpack.Packer(use_bin_type=True).pack

CANCELLED_CLASS = class_path(JobCancelled())
"""The error class a cancelled job's history and stored result name."""


def job_context(d: Delivery, attempt: int, outcome: str) -> dict[str, Any]:
    """What a log record about a run carries (``record.chasqui``), for log handlers and error trackers to show
    beside the message: which job, of which queue and task, its attempt, and what became of it."""
    return {"job_id": d.job.id, "queue": d.keys.queue, "task": d.job.task, "attempt": attempt,
            "outcome": outcome, "entry_id": d.entry_id.decode(errors="replace")}


class Outcomes:
    """Turns what happened to each fetched job into the settler's batched writes."""

    def __init__(self, settler: Settler, policy: RetryPolicy, worker_id: str) -> None:
        self.settler = settler
        self.policy = policy
        self.worker_id = worker_id
        self._retry_lines = LogBudget(logger, "jobs failed and were scheduled for a retry")
        self._dead_lines = LogBudget(logger, "jobs failed for good and went to the dead-letter queue")
        self._refused_lines = LogBudget(logger, "jobs refused for a bad signature")
        self._skipped_lines = LogBudget(logger, "jobs not run because their idempotency key had completed")
        self.cancelled: list[tuple[QueueKeys, bytes, str]] = []
        """(keys, entry id, job id) of jobs dead-lettered as cancelled: their cancel requests are struck once the
        settler has written them (cancel_watch.Watch)."""

    def summarise_logs(self) -> None:
        """Log how many retry / dead-letter / refusal / skip lines the per-second budget held back."""
        self._retry_lines.summarise()
        self._dead_lines.summarise()
        self._refused_lines.summarise()
        self._skipped_lines.summarise()

    # --- after a run ------------------------------------------------------------

    def succeeded(self, d: Delivery, result: Any, started: int, duration: int) -> None:
        job = d.job
        stored = None
        if job.result_ttl:
            stored = self._stored(d.keys, job, "SUCCESSFUL", started, now_ms(), return_value=result)
        marker = None
        if d.idempotency_key is not None:
            marker = (d.keys.done + d.idempotency_key, ttl_ms(job))
        flow = job.meta.get(FLOW)  # the whole cost of workflows to a job outside one
        # packed first, so a value msgpack refuses changes nothing; None is not stored (read back as None)
        value = b"" if flow is None or result is None else _packb(result)
        self.settler.complete(d.keys, d.entry_id, job.id, job.task, duration, stored, marker)
        if flow is not None:
            self.settler.flow_end(d.keys, d.entry_id, flow, job.id, "ok", value)

    def skipped(self, d: Delivery, completed_by: str) -> None:
        """Acknowledge a job without running it: job ``completed_by`` completed its idempotency key.

        Its result record (when results are kept) says SUCCESSFUL with no
        return value and names that job, unless it is that job: then the
        record of the run that completed it stays as it is.
        """
        job = d.job
        if self._skipped_lines.allow():
            by = "this same job" if completed_by == job.id else f"job {completed_by}"
            logger.info("job %s (%s) not run: its idempotency key %r was completed by %s; acknowledged", job.id,
                        job.task, d.idempotency_key, by)
        stored = None
        if job.result_ttl and completed_by != job.id:
            stored = self._stored(d.keys, job, "SUCCESSFUL", None, now_ms(), duplicate_of=completed_by)
        self.settler.skip(d.keys, d.entry_id, job.id, job.task, d.idempotency_key or "", completed_by, stored)
        self._flow_end(d.keys, d.entry_id, job, "ok")

    def failed(self, d: Delivery, exc: BaseException, started: int, duration: int) -> None:
        """Record the error in the job's history, then retry it after its backoff or dead-letter it."""
        job = d.job
        finished = now_ms()
        runs_made = job.attempt + 1
        error_class, text, traceback = describe(exc)
        decision = decide(job, exc, runs_made, d.handler, self.policy)
        if d.cancel_requested and decision.reason != "cancelled":  # whatever it raised once told to stop
            decision = Decision(False, reason="cancelled")
        record = error_record(
            attempt=runs_made, exc_class=error_class, message=text, traceback=traceback, worker=self.worker_id,
            started_at=started, finished_at=finished, backoff_ms=decision.delay_ms if decision.retry else None,
        )
        deaths = job.deaths  # runs lost with their workers were charged when the job was picked up
        payload = job.encode_after_failure(runs_made, record, deaths)
        text = text or type(exc).__name__
        stored = None
        if job.result_ttl:
            updated = job.after_failure(runs_made, record, deaths)
            stored = self._stored(d.keys, updated, "READY" if decision.retry else "FAILED", started, finished)
        if decision.retry:
            if self._retry_lines.allow():
                logger.info("job %s (%s) failed on attempt %d: %s: %s; retrying in %d ms", job.id, job.task,
                            runs_made, error_class, text, decision.delay_ms,
                            extra={"chasqui": job_context(d, runs_made, "retrying")})
            self.settler.retry(d.keys, d.entry_id, decision.delay_ms, payload, job_id=job.id, task=job.task,
                               attempt=runs_made, error_class=error_class, error=text,
                               duration_ms=duration, result=stored)
        else:
            cancelled = decision.reason == "cancelled"
            if self._dead_lines.allow():
                # a WARNING, as before: under Django, the task framework's own logger (django.tasks) reports the
                # failure at ERROR with its traceback, and a second ERROR here would make error trackers count
                # each failure twice; this line carries the job's context for any handler that reads it
                logger.warning("job %s (%s) failed on attempt %d: %s: %s; moved to the dead-letter queue (%s)",
                               job.id, job.task, runs_made, error_class, text, decision.reason,
                               extra={"chasqui": job_context(d, runs_made, decision.reason)})
            if cancelled:
                self.cancelled.append((d.keys, d.entry_id, job.id))
            self.settler.dead(d.keys, d.entry_id, payload, decision.reason, job_id=job.id, task=job.task,
                              error_class=error_class, error=text, handler_failed=not cancelled,
                              duration_ms=duration, result=stored)
            self._flow_end(d.keys, d.entry_id, job, "dead")

    def internal(self, d: Delivery, doing: str, exc: BaseException) -> None:
        """Dead-letter a job whose outcome could not be recorded, with reason ``internal``."""
        error = f"{doing} failed: {class_path(exc)}: {message(exc)}"
        logger.error("job %s (%s): %s; moved to the dead-letter queue (internal)", d.job.id, d.job.task, error,
                     exc_info=exc)
        try:
            self.settler.dead(d.keys, d.entry_id, d.payload, "internal", job_id=d.job.id, task=d.job.task,
                              error_class=class_path(exc), error=error)
            self._flow_end(d.keys, d.entry_id, d.job, "dead")
        except Exception:  # not even that: the entry stays pending and is reclaimed after the visibility timeout
            logger.exception("job %s: could not be dead-lettered either; it will be reclaimed", d.job.id)

    def cancelled_unstarted(self, d: Delivery, requested: int) -> None:
        """Dead-letter a job cancelled before it started (``cancelled``): it never runs."""
        self.cancelled.append((d.keys, d.entry_id, d.job.id))
        self.refuse(d.keys, d.entry_id, d.payload, "cancelled", CANCELLED_CLASS,
                    cancel_words(requested, running=False), d.job)

    def requeue(self, d: Delivery) -> None:
        """Put a fetched job that never started back on the stream, as it was; a start mark written ahead of its
        start (a suspect's) is struck first, so a death of this process before the requeue reaches Redis does not
        charge it."""
        d.end_run()
        self.settler.requeue(d.keys, d.entry_id, d.payload)

    # --- before a run -----------------------------------------------------------

    def refuse(self, keys: QueueKeys, entry_id: bytes, payload: bytes, reason: str, error_class: str, error: str,
               job: Job | None = None) -> None:
        """Dead-letter an entry no handler may run (it cannot be decoded, is too big, names no task, or the attempt
        rules refuse it); a job that keeps its result gets a FAILED one, so ``get_result()`` does not say READY."""
        stored = None
        if job is not None and job.result_ttl:
            now = now_ms()
            if not job.errors or job.errors[-1].get("class") != error_class:  # say why, unless its last error does
                record = error_record(attempt=job.attempt, exc_class=error_class, message=error, traceback="",
                                      worker=self.worker_id, started_at=now, finished_at=now)
                job = job.after_failure(job.attempt, record, job.deaths)
            stored = self._stored(keys, job, "FAILED", None, now)
        self.settler.dead(keys, entry_id, payload, reason, job_id=job.id if job else "", task=job.task if job else "",
                          error_class=error_class, error=error, result=stored)
        if job is not None:
            self._flow_end(keys, entry_id, job, "dead")

    def _flow_end(self, keys: QueueKeys, entry_id: bytes, job: Job, outcome: str) -> None:
        """A workflow child's end without a return value, queued with its outcome (nothing for other jobs)."""
        flow = job.meta.get(FLOW)
        if flow is not None:
            self.settler.flow_end(keys, entry_id, flow, job.id, outcome)

    def bad_signature(self, keys: QueueKeys, entry_id: bytes, payload: bytes, job: Job, why: str) -> None:
        """Dead-letter a job whose signature is missing or wrong (``bad_signature``), and say so in the log."""
        if self._refused_lines.allow():
            logger.warning("job %r (task %r) refused: %s; moved to the dead-letter queue (bad_signature)",
                           job.id, job.task, why)
        self.refuse(keys, entry_id, payload, "bad_signature", "BadSignature", why, job)

    def refuse_foreign(self, keys: QueueKeys, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        """Dead-letter a stream entry without a job envelope, keeping its fields for inspection."""
        payload = msgpack.packb({k.decode(errors="replace"): v for k, v in fields.items()})
        self.refuse(keys, entry_id, payload, "decode_failed", "DecodeError",
                    "stream entry has no 'j' field (not written by a Chasqui producer)")

    def _stored(self, keys: QueueKeys, job: Job, status: str, started: int | None, finished: int,
                return_value: Any = None, duplicate_of: str | None = None) -> tuple[str, int, bytes]:
        """The (key, TTL ms, blob) of the job's result record, for ``get_result()``."""
        blob = encode_result(job_id=job.id, task=job.task, status=status, args=job.args, kwargs=job.kwargs,
                             enqueued_at=job.created_at, errors=job.errors, started_at=started,
                             finished_at=finished, worker=self.worker_id, return_value=return_value,
                             duplicate_of=duplicate_of)
        return keys.result + job.id, job.result_ttl * 1000, blob
