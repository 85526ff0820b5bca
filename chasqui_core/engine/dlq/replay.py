"""Acting on a queue's DLQ: replay dead jobs, or discard them for good.

By id, a call acts on at most ``MOVE_CHUNK`` entries per round trip. By
filter (``replay_matching``, ``discard_matching``) a sweep goes oldest first
one chunk per call, reports progress and can be stopped between chunks,
which is what the console's background operations rely on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import REPLAY_MARK_TTL_MS
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.dlq.browse import DLQReader, check_positive
from chasqui_core.engine.dlq.entries import DeadJob, decode_entry, format_id, parse_id
from chasqui_core.engine.dlq.shared import resolve
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.engine.dlq.selection import chunks, matching_total

MOVE_CHUNK = 500
"""Entries replayed or deleted per call when acting on a list of ids: a replay's call holds the server about
30 ms (``dlq_replay.lua`` rewrites each envelope there, 40-60 µs an entry), a discard's less."""


def _id_list(entry_ids: Iterable[str], caller: str) -> list[str]:
    """Validate every id before touching anything; drop repeats, keep order."""
    if isinstance(entry_ids, (str, bytes)):
        raise TypeError(f"{caller}() takes a list of entry ids; wrap a single id in a list: {caller}([id])")
    out: dict[str, None] = {}
    for eid in entry_ids:
        out[format_id(parse_id(eid))] = None
    return list(out)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _check_run_at(run_at_ms: int | None) -> None:
    if run_at_ms is not None and (isinstance(run_at_ms, bool) or not isinstance(run_at_ms, int) or run_at_ms < 0):
        raise ValueError(f"run_at_ms must be a time in epoch milliseconds (0 or more), got {run_at_ms!r}")


def _replayed(dead: DeadJob, reset_attempts: bool) -> bytes:
    """The envelope to send back: same id and history, a fresh budget or exactly one more run."""
    job = dead.job
    assert job is not None
    if reset_attempts:
        attempt, max_attempts = 0, job.max_attempts
    else:
        attempt, max_attempts = job.attempt, job.attempt + 1
    # deaths start again at 0: an operator sending a job back vouches that it may run
    return dataclasses.replace(job, attempt=attempt, max_attempts=max_attempts, errors=list(dead.errors),
                               replays=job.replays + 1, deaths=0).encode()


class DeadLetters(DLQReader):
    """The dead-letter queue of one queue, on a sync redis-py client: read it, replay or discard its entries."""

    def __init__(self, client: Client, queue: str) -> None:
        super().__init__(client, queue)
        self._scripts = Scripts(client)

    def replay(self, entry_ids: Iterable[str], *, reset_attempts: bool = True, run_at_ms: int | None = None) -> int:
        """Send entries back to the stream (or the delayed set, at ``run_at_ms``).

        Same job id and error history; ``replays`` goes up by one and the lost
        runs count (``deaths``) starts again. ``reset_attempts=True`` gives the
        job its whole budget again; False grants exactly one more run. Entries
        whose payload cannot be decoded stay in the DLQ. Returns how many
        entries this call moved: entries already replayed or discarded by
        someone else are not counted.
        """
        ids = _id_list(entry_ids, "replay")
        _check_run_at(run_at_ms)
        return sum(self._replay_ids(chunk, reset_attempts, run_at_ms) for chunk in _chunks(ids, MOVE_CHUNK))

    def discard(self, entry_ids: Iterable[str]) -> int:
        """Delete entries for good; returns how many were still there."""
        ids = _id_list(entry_ids, "discard")
        return sum(self._discard(chunk) for chunk in _chunks(ids, MOVE_CHUNK))

    def _discard(self, ids: list[Any]) -> int:
        """Delete entries with ``dlq_discard.lua``, which takes each out of the index in the same call."""
        return int(self._scripts.dlq_discard(keys=[self.keys.dlq], args=ids)) if ids else 0

    def replay_matching(
        self,
        filter: DLQFilter,
        *,
        reset_attempts: bool = True,
        run_at_ms: int | None = None,
        chunk: int = 500,
        progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> int:
        """``replay`` every entry that matches, oldest first, one call per chunk; see ``_sweep``."""
        _check_run_at(run_at_ms)

        def act(ids: list[str], dead: list[DeadJob] | None) -> int:
            return self._replay_ids(ids, reset_attempts, run_at_ms)

        return self._sweep(filter, act, chunk, progress, should_stop, decode=False)

    def discard_matching(
        self,
        filter: DLQFilter,
        *,
        chunk: int = 500,
        progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> int:
        """``discard`` every entry that matches, oldest first, one call per chunk; see ``_sweep``."""

        def act(ids: list[str], dead: list[DeadJob] | None) -> int:
            return self._discard(ids)

        return self._sweep(filter, act, chunk, progress, should_stop, decode=False)

    def _replay_ids(self, ids: list[str], reset_attempts: bool, run_at_ms: int | None) -> int:
        """Replay entries by id in one ``dlq_replay.lua`` call, which reads each entry and rewrites its envelope
        on the server; the few it leaves (a panic, an entry written before the index, an envelope it does not
        rewrite) are read, decoded and moved here (``_move``). Returns how many entries were moved."""
        if len(ids) > MOVE_CHUNK:
            return sum(self._replay_ids(chunk, reset_attempts, run_at_ms) for chunk in _chunks(ids, MOVE_CHUNK))
        if not ids:
            return 0
        when = "" if run_at_ms is None else str(run_at_ms)
        reply = self._scripts.dlq_replay(
            keys=[self.keys.dlq, self.keys.stream, self.keys.delayed, self.keys.totals],
            args=[self.keys.replay_marks, REPLAY_MARK_TTL_MS, "1" if reset_attempts else "0", when, *ids])
        moved = int(reply[0])
        left = reply[1:]
        if left:
            rows = [found for found in self._scripts.dlq_fetch(keys=[self.keys.dlq], args=left) if found]
            dead = [decode_entry(self.queue, eid, dict(zip(flat[::2], flat[1::2], strict=True)))
                    for eid, flat in rows]
            moved += self._move(dead, reset_attempts, run_at_ms)
        return moved

    def _move(self, dead: list[DeadJob], reset_attempts: bool, run_at_ms: int | None) -> int:
        argv: list[Any] = [self.keys.replay_marks, REPLAY_MARK_TTL_MS]
        when = "" if run_at_ms is None else str(run_at_ms)
        resolve(self.client, self.keys.dlq, dead)  # the job goes back with its whole history, tracebacks included
        for d in dead:
            if d.job is not None:
                argv += (d.entry_id, _replayed(d, reset_attempts), when, d.job.id, *d.indexed_as)
        if len(argv) == 2:
            return 0
        return int(self._scripts.dlq_move(keys=[self.keys.dlq, self.keys.stream, self.keys.delayed, self.keys.totals],
                                          args=argv))

    def _sweep(
        self,
        filter: DLQFilter,
        act: Callable[[list[str], list[DeadJob] | None], int],
        chunk: int,
        progress: Callable[[int, int], None] | None,
        should_stop: Callable[[], bool] | None,
        *,
        decode: bool,
    ) -> int:
        """Act on every matching entry, oldest first, one chunk per call (``selection.chunks``).

        Only entries present when the sweep starts are considered (the sweep
        stops at the newest id seen then), so jobs that die during a long
        sweep are left for the operator to look at. A filter on an indexed
        value reads only the matching entries, through the index.
        ``progress(done, total)`` is called once before the first chunk and
        after each one; ``done`` counts matching entries handled, including
        ones someone else removed meanwhile and undecodable ones a replay
        must leave behind. ``should_stop`` is asked before each chunk.
        """
        if not isinstance(filter, DLQFilter):
            raise TypeError(
                f"Pass a DLQFilter (DLQFilter() matches every entry), not {type(filter).__name__}"
            )
        check_positive(chunk, "chunk")
        f = None if filter.is_empty() else filter
        edges = self._edges()
        bounds = self._bounds(f)
        if edges is None or bounds is None:
            if progress is not None:
                progress(0, 0)
            return 0
        lo, hi = bounds[0], min(bounds[1], edges[1])
        total = matching_total(self, f, lo, hi)
        if total is None:  # free text, or an index being rebuilt: counted by reading the range
            total = self._count_in(f, lo, hi, max(chunk, 1000))
        done = acted = 0
        if progress is not None:
            progress(0, total)
        for step in chunks(self, f, lo, hi, chunk, decode=decode):
            if should_stop is not None and should_stop():
                break
            if step.ids:
                acted += act(step.ids, step.dead)
                done += len(step.ids)
            if progress is not None:
                progress(done, max(total, done))
        return acted
