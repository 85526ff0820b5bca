"""An add as the server receives it: the call of one of the two enqueue scripts, packed by hand.

A single add waits for its round trip, so its bytes are not built by
redis-py per call: everything but the last three arguments is packed once per
link (``heads``: the keys, the lane, the queue's settings), and each write
adds its sequence number, the re-sent flag and its jobs (``request``). A
single plain job (ready now, default priority band, no caller-given id: most
adds) goes to ``enqueue_plain.lua`` as its bare envelope; anything else to
``enqueue.lua`` as one msgpack array of the chunk's jobs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import msgpack

from chasqui_core.engine.ops.metrics import MINUTE_BUCKET_TTL_S, SECOND_BUCKET_TTL_S
from chasqui_core.engine.producer.jobspec import BuiltJob
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.store.scripts import source

LANE_TTL_MS = 600_000
"""How long a lane remembers its last write: far longer than any write stays in doubt."""

pack_command: Callable[[tuple[Any, ...]], bytes] = hiredis.pack_command
_ENQUEUE_SHA = hashlib.sha1(source("enqueue").encode()).hexdigest()
_PLAIN_SHA = hashlib.sha1(source("enqueue_plain").encode()).hexdigest()
LOAD_BOTH = pack_command(("SCRIPT", "LOAD", source("enqueue"))) + pack_command(("SCRIPT", "LOAD",
                                                                               source("enqueue_plain")))
"""Both scripts' SCRIPT LOAD: sent in front of a write that a restarted server refused (NOSCRIPT)."""
_EMPTY_BULK = b"$0\r\n\r\n"
_FIRST, _AGAIN = _EMPTY_BULK, b"$1\r\n1\r\n"
"""The scripts' re-sent flag: empty on a write's first try, ``1`` when it is sent again (the lane is read)."""
_pack_items = msgpack.Packer(use_bin_type=False).pack


def heads(keys: QueueKeys, lane: str, unique_ttl_ms: int) -> tuple[bytes, bytes]:
    """The two scripts' calls for one queue and lane, packed but for their last three arguments: (chunks, plain)."""
    k = keys
    chunks = pack_command(("EVALSHA", _ENQUEUE_SHA, 3, k.stream, k.delayed, k.lane + lane, k.unique, unique_ttl_ms,
                           k.metrics, LANE_TTL_MS, "", "", ""))
    plain = pack_command(("EVALSHA", _PLAIN_SHA, 3, k.stream, k.lane + lane, k.totals, k.second_counters,
                          k.minute_counters, SECOND_BUCKET_TTL_S, MINUTE_BUCKET_TTL_S, LANE_TTL_MS, "", "", ""))
    cut = 3 * len(_EMPTY_BULK)
    return chunks[:-cut], plain[:-cut]


def items(chunk: Sequence[BuiltJob]) -> bytes:
    """A chunk's jobs as ``enqueue.lua`` reads them: one msgpack array of (caller's id, when, payload) laid flat."""
    flat: list[Any] = []
    for uid, when, payload, _ in chunk:
        flat += (uid, when, payload)
    # str type for every item: the scripting engine's msgpack reads raw strings
    packed: bytes = _pack_items(flat)
    return packed


def request(heads: tuple[bytes, bytes], chunk: Sequence[BuiltJob], seq: bytes, again: bool) -> bytes:
    """One try of a write: its script's call with the sequence number (the same for every try), the re-sent
    flag and its jobs."""
    if len(chunk) == 1 and not chunk[0][0] and not chunk[0][1]:  # one job, no caller's id, ready in the default band
        head, body = heads[1], chunk[0][2]
    else:
        head, body = heads[0], items(chunk)
    return b"%s$%d\r\n%s\r\n%s$%d\r\n%s\r\n" % (head, len(seq), seq, _AGAIN if again else _FIRST, len(body), body)
