"""The jobs one worker is running now, paged: from its start journals, not its heartbeat.

A worker's heartbeat lists its 20 longest runs; the start journal
(``{chasqui:<q>}:running:<worker>``, journal.py) has every run under way,
entry id -> start ms. A queue with priority bands (priority.py) has a
journal per band stream (``running-high:<worker>``, ``running-low:<worker>``),
since entry ids repeat across streams. A page is the journal entries of the
worker's queues and their bands, oldest start first, with each entry's job
read from its band's stream (the entry stays there until it is settled). One
round trip for the journals (every band's is read: a missing one is empty),
one for the page's entries.
"""

from __future__ import annotations

from dataclasses import dataclass

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.jobs.envelope import DecodeError, decode
from chasqui_core.engine.store.keys import BANDS, QueueKeys
from chasqui_core.engine.jobs.priority import band_label, job_priority

MAX_PAGE = 200


@dataclass(frozen=True, slots=True)
class RunningJob:
    queue: str
    entry_id: str
    started_at_ms: int
    task: str
    """"" when the entry was settled between the two reads, or is not a job this version can read."""
    job_id: str
    band: str = ""
    """The priority band whose stream holds the entry: "high", "" (the default band) or "low"."""
    priority: int = 0
    """The job's priority (0 by default, or when its entry could not be read)."""

    @property
    def band_label(self) -> str:
        return band_label(self.band)


@dataclass(frozen=True, slots=True)
class RunningPage:
    items: list[RunningJob]
    total: int
    """Runs under way on all the worker's queues: the pages' sum."""
    offset: int


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def running_jobs(client: Client, worker_id: str, queues: list[str], *, offset: int = 0, limit: int = 50) -> RunningPage:
    """The runs under way on ``worker_id`` over its ``queues``, oldest first, ``limit`` from ``offset``."""
    if limit < 1 or limit > MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    if offset < 0:
        raise ValueError(f"offset must be 0 or more, got {offset}")
    all_keys = [QueueKeys.for_queue(q).in_band(b) for q in queues for b in BANDS]
    pipe = client.pipeline(transaction=False)
    for k in all_keys:
        pipe.hgetall(k.running(worker_id))
    runs: list[tuple[int, str, str, QueueKeys]] = []
    for k, journal in zip(all_keys, pipe.execute(), strict=True):
        for entry, started in (journal or {}).items():
            try:
                runs.append((int(started), _text(entry), k.queue, k))
            except ValueError:
                continue
    runs.sort(key=lambda r: (r[0], r[1]))
    chosen = runs[offset : offset + limit]
    pipe = client.pipeline(transaction=False)
    for _, entry, _, k in chosen:
        pipe.xrange(k.stream, entry, entry)
    items = []
    for (started, entry, queue, k), found in zip(chosen, pipe.execute() if chosen else [], strict=True):
        task = job_id = ""
        priority = 0
        if found:
            payload = found[0][1].get(b"j")
            if payload is not None:
                try:
                    job = decode(payload)
                    task, job_id, priority = job.task, job.id, job_priority(job.meta)
                except DecodeError:
                    pass
        items.append(RunningJob(queue, entry, started, task, job_id, k.band, priority))
    return RunningPage(items=items, total=len(runs), offset=offset)
