"""Browse a queue's delayed jobs (scheduled runs and retries waiting for their
backoff) and act on one: cancel it, or run it now.

The delayed set is a sorted set scored by run-at time, whose members are the
encoded jobs themselves, so acting on a job means naming its exact member:
``find`` locates it by job id and the actions hand that member to
``delayed_move.lua``, which removes it atomically. A job the promoter moved
(or another operator acted on) in the meantime is simply "not found".

Finding a job by id reads its mark first: every script that adds to the set
notes the score it gave the job under ``<prefix>djob:<job id>`` (keys.py,
``mark_delayed`` in lua/prelude.lua). The mark is not removed when the job
leaves the set (it expires a day after the job is due), so ``by_mark``
checks it: ``delayed_find.lua`` returns the members of that score whose
envelope starts with the id (members sharing a score are in byte order, so
it bisects them: a bulk schedule of a million costs about 20 steps on the
server), and the one holding the id is kept. Without a mark (a job added
before marks were written) the set is scanned with ``ZSCAN MATCH``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.jobs.envelope import Job, decode, id_head
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.store.scripts import Scripts

UNDECODABLE = "<undecodable>"
"""Task name shown for a member that is not a job envelope."""

MAX_PAGE = 1000

FOUND_MOST = 8
"""Members of one job's head read at its mark's score (one, unless an id was added twice)."""


@dataclass(frozen=True, slots=True)
class DelayedJob:
    job_id: str
    task: str
    run_at_ms: int
    attempt: int
    """Runs already made (0 for a job scheduled ahead, 1+ for a retry)."""
    args: list[Any]
    kwargs: dict[str, Any]
    errors: list[dict[str, Any]]
    member: bytes
    """The member exactly as stored: what an action must name."""


@dataclass(frozen=True, slots=True)
class DelayedPage:
    items: list[DelayedJob]
    next_cursor: str | None
    """Pass to ``page`` for the following items; None on the last page."""


def _to_job(member: bytes, score: float) -> DelayedJob:
    try:
        job = decode(member)
    except Exception:  # DecodeError, or anything odd a foreign member trips in the decoder
        return DelayedJob("", UNDECODABLE, int(score), 0, [], {}, [], member)
    return _delayed_job(member, job, score)


def _delayed_job(member: bytes, job: Job, score: float) -> DelayedJob:
    return DelayedJob(job.id, job.task, int(score), job.attempt, job.args, job.kwargs, job.errors, member)


def _format_score(score: float) -> str:
    return str(int(score)) if score.is_integer() else repr(score)


CURSOR_PATTERN = r"^-?[0-9]{1,20}(\.[0-9]{1,20})?(e[+-]?[0-9]{1,2})?:[0-9]{1,9}$"
"""The cursors ``page`` hands out, as a JSON Schema pattern: every cursor it matches is one ``_parse_cursor``
takes and Redis reads as a finite score (the API's schema publishes it)."""


def _parse_cursor(cursor: str) -> tuple[str, int]:
    """A cursor is "<score>:<entries of that score already returned>"."""
    bad = ValueError(f"Cursor {cursor!r} is not one returned by a previous page; start again without a cursor")
    if not isinstance(cursor, str):
        raise bad
    score, sep, offset = cursor.rpartition(":")
    if not sep:
        raise bad
    try:
        float(score)
        skip = int(offset)
    except ValueError:
        raise bad from None
    if skip < 0 or score.lower() in ("nan", "+nan", "-nan"):
        raise bad
    return score, skip


def page(client: Client, queue: str, *, cursor: str | None = None, limit: int = 50) -> DelayedPage:
    """Up to ``limit`` delayed jobs, soonest first, in one round trip.

    The cursor holds the last score returned and how many entries of that score
    came back already, so many jobs sharing one run-at time (a bulk schedule)
    are walked without skipping or repeating any, as long as none of that
    same score is added or removed between pages.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_PAGE}, got {limit!r}")
    keys = QueueKeys.for_queue(queue)
    if cursor is None:
        low, skip = "-inf", 0
    else:
        low, skip = _parse_cursor(cursor)
    rows = client.zrangebyscore(keys.delayed, low, "+inf", start=skip, num=limit + 1, withscores=True)
    more = len(rows) > limit
    rows = rows[:limit]
    items = [_to_job(member, score) for member, score in rows]
    if not more or not rows:
        return DelayedPage(items, None)
    last = rows[-1][1]
    same = sum(1 for _, score in rows if score == last)
    if cursor is not None and last == float(low):
        same += skip  # the whole page shared the cursor's score
    return DelayedPage(items, f"{_format_score(last)}:{same}")


def depth(client: Client, queue: str) -> int:
    return int(client.zcard(QueueKeys.for_queue(queue).delayed))


def _glob_escape(text: str) -> bytes:
    out = bytearray()
    for byte in text.encode():
        if byte in b"*?[]\\":
            out += b"\\"
        out.append(byte)
    return bytes(out)


def _held(member: bytes, job_id: str) -> Job | None:
    """The member's job when it is the one with this id."""
    try:
        job = decode(member)
    except Exception:  # DecodeError, or anything odd a foreign member trips in the decoder  # noqa: BLE001
        return None
    return job if job.id == job_id else None


def by_mark(client: Client, keys: QueueKeys, job_id: str,
            mark: bytes | str) -> tuple[bytes, Job, float] | Literal[False] | None:
    """The job's member, decoded job and score, found at the score its mark holds (``delayed_find.lua``); one
    round trip.

    False when the job is not at that score (it left the set since: the mark
    is stale); None when the mark is not a number.
    """
    try:
        score = float(mark)
    except ValueError:
        return None
    if score != score or score in (float("inf"), float("-inf")):
        return None
    for member in Scripts(client).delayed_find(keys=[keys.delayed], args=[repr(score), id_head(job_id), FOUND_MOST]):
        job = _held(member, job_id)
        if job is not None:
            return member, job, score
    return False


def find(client: Client, queue: str, job_id: str) -> DelayedJob | None:
    """The delayed job with this id, or None.

    Reads the job's mark; without one, or when it cannot tell, scans the set:
    ids are stored verbatim inside the encoded members, so ZSCAN's MATCH lets
    the server filter; each candidate is decoded to confirm it is the job's id
    and not text that merely contains it. Costs one round trip per
    1000 members scanned.
    """
    if not isinstance(job_id, str) or not job_id:
        raise ValueError("job_id must be a non-empty string")
    keys = QueueKeys.for_queue(queue)
    mark = client.get(keys.delayed_mark(job_id))
    if mark is not None:
        hit = by_mark(client, keys, job_id, mark)
        if hit is False:
            return None
        if hit is not None:
            return _delayed_job(*hit)
    pattern = b"*" + _glob_escape(job_id) + b"*"
    for member, score in client.zscan_iter(keys.delayed, match=pattern, count=1000):
        job = _to_job(member, score)
        if job.job_id == job_id:
            return job
    return None


def cancel(client: Client, queue: str, job_id: str) -> bool:
    """Remove a delayed job for good; False when it is not (or no longer) in the delayed set."""
    job = find(client, queue, job_id)
    if job is None:
        return False
    keys = QueueKeys.for_queue(queue)
    # a cancelled job frees its id: the same job id may be added again at once
    return bool(Scripts(client).delayed_move(keys=[keys.delayed, keys.stream],
                                             args=["cancel", job.member, keys.unique + job.job_id]) == 1)


def run_now(client: Client, queue: str, job_id: str) -> str | None:
    """Move a delayed job to the stream at once; its new stream entry id, or None when not found."""
    job = find(client, queue, job_id)
    if job is None:
        return None
    keys = QueueKeys.for_queue(queue)
    reply = Scripts(client).delayed_move(keys=[keys.delayed, keys.stream], args=["run", job.member])
    if reply == 0:
        return None
    return reply.decode() if isinstance(reply, bytes) else str(reply)
