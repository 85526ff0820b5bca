"""What many dead-letter entries share, stored once: tracebacks, and the last error's class and message.

A million dead jobs of an incident share a handful of tracebacks, yet each
envelope carried its own (about 40% of an entry). So the settler writes a dead
job's envelope with each error record's traceback replaced by a short id
(``tb``) and sends the texts beside it; ``settle.lua`` keeps them in a hash
per error group, ``<dlq>:tb:<group id>`` (text id -> traceback). A traceback
ends with its own message ("order 1234 not found"), which would make each one
unique: the stored text has ``MESSAGE`` where the record's message was, and
reading puts the message back. The last
error's class and message are the entry's own ``error_class`` and ``error``
fields, so the record keeps only a flag (``entry``) saying so.

Lifetime: a group's hash goes with the group's last entry, in the same
script that removes it (``dlq_removal_flush``: replay, discard, retention
trim), so the texts live exactly as long as an entry may name them. The
group's count says that only while the index counts every entry: during a
rebuild, entries not indexed yet are in no count, so the hash is kept, and
the chunk that ends the rebuild deletes the hashes of the groups
(``<dlq>:tbgroups``) left without an entry (``dlq_texts_sweep``).

Readers put the texts back: ``decode_entry`` restores the class and message
(they are in the entry), ``resolve`` the tracebacks (one round trip for a
page or a chunk). Entries written before this keep their texts inline and
are read as they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgpack

class HasSharedTexts(Protocol):
    """What ``resolve`` reads of a dead job (``entries.DeadJob``): its error records and its error group, named
    by this protocol so that this module, which ``entries`` imports, need not import it back."""

    @property
    def errors(self) -> list[Any]: ...

    @property
    def stored_fingerprint_id(self) -> str: ...


TEXT_REF = "tb"
"""The key of an error record that names its traceback in the group's hash (instead of ``traceback``)."""
FROM_ENTRY = "entry"
"""The key of the last error record whose class and message are the entry's ``error_class`` and ``error``."""
MESSAGE = "\x00"
"""Where a shared traceback held its record's message (a character no traceback holds)."""
_ERRORS = 9
"""The error history's place in an envelope (``envelope.Job._packed``)."""

_pack = msgpack.Packer(use_bin_type=True).pack
_pack_str = msgpack.Packer(use_bin_type=False).pack
"""The texts go to Lua's cmsgpack, which reads str, not bin."""


def texts_key(dlq_key: str, group: str) -> str:
    """The hash of one error group's shared tracebacks (beside the index, not in it: a rebuild keeps it)."""
    return f"{dlq_key}:tb:{group}"


def text_id(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


def split(payload: bytes, error_class: str, error: str) -> tuple[bytes, bytes]:
    """The envelope to store, and the tracebacks it names (msgpack ``[id, text, ...]``, or b"" for none).

    A payload that is not an envelope this can read is stored as it is.
    """
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception:  # not msgpack at all: kept whole, as before
        return payload, b""
    if type(raw) is not list or len(raw) <= _ERRORS or type(raw[_ERRORS]) is not list or not raw[_ERRORS]:
        return payload, b""
    texts: dict[str, str] = {}
    errors = raw[_ERRORS]
    for record in errors:
        if type(record) is not dict:
            return payload, b""
        tb = record.get("traceback")
        if type(tb) is str and tb and MESSAGE not in tb:
            said = record.get("message")
            said = said if type(said) is str else ""
            at = tb.rfind(said) if said else -1
            if at >= 0:  # the message's own last line: the rest is what the group's failures share
                tb = tb[:at] + MESSAGE + tb[at + len(said):]
            tid = text_id(tb)
            texts[tid] = tb
            del record["traceback"]
            record[TEXT_REF] = tid
    last = errors[-1]
    if last.get("class") == error_class and last.get("message") == error and error:
        del last["class"], last["message"]
        last[FROM_ENTRY] = 1
    elif not texts:
        return payload, b""
    flat: list[str] = [part for pair in texts.items() for part in pair]
    return _pack(raw), _pack_str(flat) if flat else b""


def restore_record(errors: list[Any], error_class: str, error: str) -> None:
    """Give the last error record back the class and message it shares with its entry (in place)."""
    if errors and type(errors[-1]) is dict and errors[-1].get(FROM_ENTRY):
        last = errors[-1]
        del last[FROM_ENTRY]
        last["class"], last["message"] = error_class, error


MAX_GROUPS_SEARCHED = 10_000
"""Error groups whose shared tracebacks a text search reads (the biggest first)."""


def text_ids_holding(client: Any, dlq_key: str, groups_key: str, folded: str,
                     mask: Callable[[str], str]) -> list[str]:
    """The ids of the shared tracebacks whose visible (masked) text holds ``folded``: a text search looks for
    the entries naming them, since the entries no longer hold the text. ``groups_key``: the index's error
    groups (``IndexKeys.groups``), biggest first."""
    groups = client.zrevrange(groups_key, 0, MAX_GROUPS_SEARCHED - 1)
    if not groups:
        return []
    pipe = client.pipeline(transaction=False)
    for group in groups:
        pipe.hgetall(texts_key(dlq_key, group.decode() if isinstance(group, bytes) else group))
    found = []
    for texts in pipe.execute():
        for tid, text in texts.items():
            shown = (text if isinstance(text, str) else text.decode("utf-8", "replace")).replace(MESSAGE, "")
            if folded in mask(shown).casefold():
                found.append(tid.decode() if isinstance(tid, bytes) else tid)
    return found


def resolve(client: Any, dlq_key: str, dead: Sequence[HasSharedTexts]) -> None:
    """Put each record's shared traceback back in place of its id (one pipelined read for all of ``dead``)."""
    wanted: dict[str, list[dict[str, Any]]] = {}
    for d in dead:
        for record in d.errors:
            if type(record) is dict and TEXT_REF in record:
                wanted.setdefault(d.stored_fingerprint_id, []).append(record)
    if not wanted:
        return
    pipe = client.pipeline(transaction=False)
    for group, records in wanted.items():
        pipe.hmget(texts_key(dlq_key, group), [str(r[TEXT_REF]) for r in records])
    for records, texts in zip(wanted.values(), pipe.execute(), strict=True):
        for record, text in zip(records, texts, strict=True):
            del record[TEXT_REF]
            tb = (text if isinstance(text, str) else text.decode("utf-8", "replace")) if text else ""
            head, marked, tail = tb.rpartition(MESSAGE)
            record["traceback"] = head + str(record.get("message", "")) + tail if marked else tb
