"""Empty a queue of its waiting jobs: the entries of its streams no worker was handed yet.

``purge.lua`` deletes them a chunk at a time, each chunk atomic: it reads the
consumer group's last-delivered id in the same call, so an entry a reader
fetched meanwhile is never deleted, and it counts what it deleted as
``purged`` in the queue's counters. A queue with priority bands (priority.py)
has a stream per band; each is emptied the same way, highest band first.
Entries already delivered (running, or fetched and about to run) stay and are
settled as usual; the delayed set and the DLQ are not touched. The jobs'
idempotency markers (``job_id=``) are left to expire, so a purged job id
cannot be added again before its marker's TTL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import BANDS, GROUP, QueueKeys
from chasqui_core.engine.jobs.priority import band_label
from chasqui_core.engine.store.scripts import Scripts
from chasqui_core.engine.ops.stats import add_stream_reads, stream_figures, waiting_of

CHUNK = 1000
"""Entries deleted per call: a call holds the server for about a millisecond."""


def waiting_by_band(client: Client, keys: QueueKeys) -> dict[str, int]:
    """How many entries a purge would delete now, per band ("high", "default", "low"; highest first): each
    stream's entries not delivered to a worker. A band without a stream counts 0. One round trip."""
    pipe = client.pipeline(transaction=False)
    for band in BANDS:  # a band without a stream reads as empty: no need to read the queue's set of bands first
        add_stream_reads(pipe, keys.in_band(band).stream)
    replies = pipe.execute(raise_on_error=False)
    out = {}
    for i, band in enumerate(BANDS):
        out[band_label(band)] = waiting_of(*stream_figures(replies[2 * i], replies[2 * i + 1]))
    return out


def waiting(client: Client, keys: QueueKeys) -> int:
    """How many entries a purge would delete now, over all the queue's bands (``waiting_by_band``)."""
    return sum(waiting_by_band(client, keys).values())


def newest_ids(client: Client, keys: QueueKeys) -> dict[str, str]:
    """The id of each band's newest entry, by band ("" the default; '0-0' when empty): a purge's bounds."""
    pipe = client.pipeline(transaction=False)
    for band in BANDS:
        pipe.xrevrange(keys.in_band(band).stream, "+", "-", count=1)
    out = {}
    for band, newest in zip(BANDS, pipe.execute(), strict=True):
        raw = newest[0][0] if newest else b"0-0"
        out[band] = raw.decode() if isinstance(raw, bytes) else str(raw)
    return out


def purge_waiting(
    client: Client,
    keys: QueueKeys,
    *,
    upto: Mapping[str, str] | None = None,
    chunk: int = CHUNK,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Delete the waiting entries of the queue's streams, band by band, chunk by chunk; returns how many.

    ``upto`` bounds each band (by band name, "" the default: ``newest_ids``
    when the purge began), so jobs added while it runs are kept and the loop
    ends however fast producers add; a band it does not name is left alone.
    Without it every band is emptied to its end. ``progress`` gets the running
    total after each chunk that deleted something.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be 1 or more, got {chunk}")
    bounds = dict(upto) if upto is not None else dict.fromkeys(BANDS, "+")
    unknown = set(bounds) - set(BANDS)
    if unknown:
        raise ValueError(f"unknown priority band(s) {sorted(unknown)!r} in upto: use 'high', '' and 'low'")
    scripts = Scripts(client)
    total = 0
    for band in BANDS:
        if band not in bounds or bounds[band] == "0-0":  # no such stream, or it was empty when the purge began
            continue
        stream = keys.in_band(band).stream
        while True:
            deleted, more = scripts.purge(keys=[stream, keys.metrics], args=[GROUP, chunk, bounds[band]])
            total += int(deleted)
            if progress is not None and deleted:
                progress(total)
            if not int(more):
                break
    return total
