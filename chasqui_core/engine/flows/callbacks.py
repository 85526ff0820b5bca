"""A callback as its batch's hash stores it, so ``flows.lua`` can enqueue it whole or fed with results.

A callback fed its batch's results gets them in its meta (``refs.FED``) when
it fires. Lua cannot re-encode an envelope faithfully (its msgpack library
packs an empty map as an empty array), so the envelope is stored in pieces
here and the script only writes a map header and joins bytes.
"""

from __future__ import annotations

from typing import Any

import msgpack

from chasqui_core.engine.jobs.envelope import FIELDS, VERSION

_pack = msgpack.Packer(use_bin_type=True).pack

FEEDS = ("one", "all")
"""What a fed callback gets: ``one``, the single child's result (a chain's next step); ``all``, the list of every
child's result in the order given (fan-in)."""


def stored(which: str, job_id: str, payload: bytes, feed: str | None = None) -> list[Any]:
    """The hash fields (laid flat) of callback ``which`` (``success`` or ``complete``) whose envelope is
    ``payload``; with ``feed``, in the pieces ``flows.lua`` joins around the fed value."""
    if feed is None:
        return [f"{which}:id", job_id, f"{which}:payload", payload]
    if feed not in FEEDS:
        raise ValueError(f"feed must be one of {', '.join(FEEDS)}, got {feed!r}")
    fields = msgpack.unpackb(payload)
    if len(fields) != FIELDS or fields[0] != VERSION:
        raise ValueError("a callback must be a job envelope of this version")
    args, meta = fields[3], fields[13]
    head = bytes([0x90 | FIELDS]) + _pack(VERSION) + _pack(fields[1]) + _pack(fields[2])
    return [f"{which}:id", job_id, f"{which}:head", head, f"{which}:argc", len(args),
            f"{which}:args", b"".join(_pack(a) for a in args),
            f"{which}:mid", b"".join(_pack(x) for x in fields[4:13]),
            f"{which}:metan", len(meta), f"{which}:meta", b"".join(_pack(k) + _pack(v) for k, v in meta.items()),
            f"{which}:feed", feed]
