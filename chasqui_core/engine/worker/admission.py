"""Admission: what a worker does with each stream entry it reads, before anything runs.

An entry becomes a ``Delivery`` the worker holds (``InFlight``), or it is
refused and dead-lettered right here: what cannot be decoded or is too big, a
job without a valid signature when the worker has signing keys (checked
before its task is looked up), an unknown task, and whatever the attempt
rules refuse at pickup (``retry.at_pickup``: a poison pill, a job whose last
run was lost with no run left, an envelope that is not one a producer
wrote). Runs that a dead worker lost (the entry's ``lost`` field, written by
reclaim.lua) are charged to the job here, once, before those rules look at it.

Runs once per entry read, so the well-formed case is a decode, a few dict
lookups and an append.
"""

from __future__ import annotations

import logging
from typing import Any

from chasqui_core.engine.jobs.envelope import DecodeError, Job, decode, now_ms
from chasqui_core.engine.jobs.idempotency import IDEMPOTENCY_KEY, key_of
from chasqui_core.engine.worker.inflight import InFlight
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.worker.limits import Limits
from chasqui_core.engine.worker.log_budget import LogBudget
from chasqui_core.engine.worker.delivery import Delivery, ref_of
from chasqui_core.engine.settle.outcomes import Outcomes
from chasqui_core.engine.recovery.reclaim import LOST_FIELD, RECOVERED_FIELD, lost_runs
from chasqui_core.engine.jobs.registry import TIMEOUT_META, HandlerRegistry, check_timeout
from chasqui_core.engine.settle.retry import RetryPolicy, at_pickup, budget
from chasqui_core.engine.jobs.signing import Signer

logger = logging.getLogger("chasqui.worker")

class Admission:
    def __init__(self, registry: HandlerRegistry, outcomes: Outcomes, policy: RetryPolicy, held: InFlight, *,
                 signer: Signer | None, max_payload_bytes: int, default_timeout: float | None,
                 limits: Limits | None = None) -> None:
        self.registry = registry
        self.outcomes = outcomes
        self.policy = policy
        self.held = held
        self.signer = signer
        self.max_payload_bytes = max_payload_bytes
        self.default_timeout = default_timeout
        self.limits = limits or None
        """The worker's rate and concurrency limits; None when it has none (the usual case)."""
        self.skipped = 0
        """Entries read that this worker already held (never expected; counted and logged, not dropped)."""
        self._skip_lines = LogBudget(logger, "entries read twice while held")

    def admit(self, keys: QueueKeys, entries: list[Any]) -> list[Delivery]:
        """Decode entries read from ``keys``'s stream: the deliveries to run, in order; the rest are refused."""
        accepted: list[Delivery] = []
        held = self.held
        signer = self.signer
        refuse = self.outcomes.refuse
        limits = self.limits
        queue = keys.queue
        stream = keys.stream
        now = now_ms()  # once per read: at_pickup only asks whether a job was created a day ahead of it
        for entry_id, fields in entries:
            if fields is None:  # deleted while pending
                continue
            ref = ref_of(stream, entry_id)
            if ref in held:
                self.skipped += 1
                if self._skip_lines.allow():
                    logger.warning("entry %s on %s was read again while this worker holds it; the held delivery "
                                   "goes on", entry_id.decode(), queue)
                continue
            lost_field = recovered = None
            if type(fields) is list:  # raw reply: [field, value, ...]
                payload = fields[1] if len(fields) == 2 and fields[0] == b"j" else None
                if payload is None:
                    fields = dict(zip(fields[::2], fields[1::2], strict=False))
                    payload = fields.get(b"j")
                    lost_field = fields.get(LOST_FIELD)
                    recovered = fields.get(RECOVERED_FIELD)
            else:
                payload = fields.get(b"j")
                lost_field = fields.get(LOST_FIELD)
                recovered = fields.get(RECOVERED_FIELD)
            if payload is None:
                self.outcomes.refuse_foreign(keys, entry_id, fields)
                continue
            if len(payload) > self.max_payload_bytes:
                refuse(keys, entry_id, payload, "oversize", "PayloadTooLarge",
                       f"payload is {len(payload)} bytes; this worker accepts at most {self.max_payload_bytes}")
                continue
            try:
                job = decode(payload)
            except DecodeError as exc:
                refuse(keys, entry_id, payload, "decode_failed", "DecodeError", str(exc))
                continue
            if signer is not None and not signer.verify(job):
                self.outcomes.bad_signature(keys, entry_id, payload, job, signer.refusal(job))
                continue
            handler = self.registry.get(job.task)
            if handler is None:
                refuse(keys, entry_id, payload, "unknown_task", "UnknownTask",
                       f"no task named {job.task!r} is registered in this worker", job)
                continue
            runs = budget(job, handler, self.policy)
            lost = 0
            if lost_field is not None:
                lost = self._charge(job, lost_field)
                payload = job.encode()
            times = int(recovered) if recovered is not None and recovered.isdigit() else 0
            refusal = at_pickup(job, runs, lost=lost, now=now, recovered=times)
            if refusal is not None:
                refuse(keys, entry_id, payload, refusal.reason, refusal.error_class, refusal.error, job)
                continue
            meta = job.meta
            marker = None
            if IDEMPOTENCY_KEY in meta:
                try:
                    marker = key_of(job)
                except DecodeError as exc:
                    refuse(keys, entry_id, payload, "decode_failed", "DecodeError", str(exc), job)
                    continue
            timeout = self.default_timeout if handler.timeout is None else handler.timeout
            if TIMEOUT_META in meta:
                try:
                    timeout = check_timeout(meta[TIMEOUT_META])
                except ValueError as exc:
                    refuse(keys, entry_id, payload, "decode_failed", "DecodeError", f"malformed envelope: {exc}", job)
                    continue
            d = Delivery(keys, entry_id, payload, job, handler, ref, runs, marker, timeout)
            if times or job.deaths:
                d.suspect = True
            if limits is not None:
                d.limits = limits.buckets(keys, job)
            held.add(d)
            accepted.append(d)
        return accepted

    @staticmethod
    def _charge(job: Job, field: bytes) -> int:
        """Charge each lost run to the job: a run made, a line in its error history, and a death only when its
        worker's death is on record (lost contact is not one)."""
        runs = lost_runs(field)
        for run in runs:
            job.attempt += 1
            if run.died:
                job.deaths += 1
            job.errors = [*job.errors, run.record(job.attempt, job.replays)]
        return len(runs)

    def summarise_logs(self) -> None:
        self._skip_lines.summarise()
