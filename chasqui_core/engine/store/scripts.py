"""The engine's Lua scripts, loaded once from the ``lua/`` folder beside this file.

Each script is sent by SHA (EVALSHA) and loaded on first use; redis-py's
Script objects do that for plain clients, pipelines and asyncio clients alike.

Every script but those in ``STANDALONE`` starts with ``lua/prelude.lua``, the helpers they share (the
server's clock, the counter bumps). The prelude goes on the script's first
line, its comment lines dropped and its code lines joined with spaces, so
line numbers in a Lua error are those of the script's own file. Its constants
are Python's (the counter buckets' key parts from keys.py, their lifetimes
from metrics.py), written into the text here rather than sent with every call.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from string import Template
from typing import Any

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.dlq.fingerprint import INVALID_RETRY_FINGERPRINT, fingerprint_id
from chasqui_core.engine.jobs.envelope import FIELDS as ENVELOPE_FIELDS
from chasqui_core.engine.jobs.envelope import VERSION as ENVELOPE_VERSION
from chasqui_core.engine.jobs.events import EVENTS_MAXLEN
from chasqui_core.engine.store.keys import (DELAYED, DELAYED_MARK, DELAYED_MARK_GRACE_MS, DLQ_INDEX_VERSION, DURATIONS,
                                            GROUP, MINUTE_BUCKET, SECOND_BUCKET, TOTALS)
from chasqui_core.engine.ops.metrics import MINUTE_BUCKET_TTL_S, SECOND_BUCKET_TTL_S

_LUA_DIR = Path(__file__).with_name("lua")

NAMES = ("enqueue", "settle", "promote", "lock", "reclaim", "dlq_move", "delayed_move", "lease", "delayed_stats",
         "schedule_advance", "limit_take", "limit_release", "op_claim", "op_update", "dlq_discard",
         "dlq_reindex", "control_send", "purge", "rollup",
         "cancel", "delayed_find", "dlq_trim", "dlq_fetch", "flow_start", "flow_add", "dlq_replay")

WITH_DLQ_INDEX = frozenset({"settle", "dlq_move", "dlq_discard", "dlq_reindex", "dlq_trim", "dlq_replay"})
"""Scripts that write or remove dead-letter entries: ``lua/dlq_index.lua`` follows the prelude in each."""

WITH_FLOWS = frozenset({"settle", "dlq_discard", "flow_start", "flow_add"})
"""Scripts that end, start or grow a workflow's batches: ``lua/flows.lua`` follows the other helpers in each."""

STANDALONE = frozenset({"enqueue_plain"})
"""Scripts loaded as they are, without the prelude: a single add waits for ``enqueue_plain``, and defining the
prelude's helpers on each call would cost it a tenth of its time (it takes what it needs in KEYS and ARGV)."""


def _lua_string(text: str) -> str:
    """``text`` safe inside a single-quoted Lua string."""
    return text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", " ")


def _squeezed(name: str, **constants: object) -> str:
    """A helper file as one line of Lua, its constants filled in."""
    text = Template((_LUA_DIR / f"{name}.lua").read_text()).substitute(**constants)
    code = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("--"):
            continue
        if "--" in line:  # joined onto one line, a trailing comment would swallow the code after it
            raise ValueError(f"{name}.lua: put this comment on a line of its own: {line!r}")
        code.append(line)
    return " ".join(code)


@cache
def prelude() -> str:
    """The prelude as one line of Lua, its constants filled in."""
    return _squeezed("prelude", SECOND_BUCKET=SECOND_BUCKET, MINUTE_BUCKET=MINUTE_BUCKET, TOTALS=TOTALS,
                     DURATIONS=DURATIONS, SECOND_BUCKET_TTL=SECOND_BUCKET_TTL_S,
                     MINUTE_BUCKET_TTL=MINUTE_BUCKET_TTL_S, DELAYED_LEN=len(DELAYED), DELAYED_MARK=DELAYED_MARK,
                     DELAYED_MARK_GRACE_MS=DELAYED_MARK_GRACE_MS, ENVELOPE_HEAD=0x90 | ENVELOPE_FIELDS,
                     ENVELOPE_VERSION=ENVELOPE_VERSION, GROUP=GROUP)


@cache
def dlq_index() -> str:
    """The DLQ index helpers as one line of Lua (see ``lua/dlq_index.lua``)."""
    return _squeezed("dlq_index", INDEX_VERSION=DLQ_INDEX_VERSION,
                     INVALID_RETRY_FP=_lua_string(fingerprint_id(INVALID_RETRY_FINGERPRINT)),
                     INVALID_RETRY_TEXT=_lua_string(INVALID_RETRY_FINGERPRINT))


@cache
def flows() -> str:
    """The workflow helpers as one line of Lua (see ``lua/flows.lua``)."""
    return _squeezed("flows", EVENTS_MAXLEN=EVENTS_MAXLEN)


@cache
def source(name: str) -> str:
    if name in STANDALONE:
        return (_LUA_DIR / f"{name}.lua").read_text()
    helpers = f"{prelude()} {dlq_index()}" if name in WITH_DLQ_INDEX else prelude()
    if name in WITH_FLOWS:
        helpers = f"{helpers} {flows()}"
    return f"{helpers} {(_LUA_DIR / f'{name}.lua').read_text()}"


ScriptCall = Callable[..., Any]
"""A registered script: call it with ``keys=[...]``, ``args=[...]`` (and ``client=`` a pipeline)."""


class Scripts:
    """Registered scripts for one client (sync or asyncio)."""

    enqueue: ScriptCall
    settle: ScriptCall
    promote: ScriptCall
    lock: ScriptCall
    reclaim: ScriptCall
    dlq_move: ScriptCall
    delayed_move: ScriptCall
    lease: ScriptCall
    delayed_stats: ScriptCall
    schedule_advance: ScriptCall
    limit_take: ScriptCall
    limit_release: ScriptCall
    op_claim: ScriptCall
    op_update: ScriptCall
    dlq_discard: ScriptCall
    dlq_reindex: ScriptCall
    control_send: ScriptCall
    purge: ScriptCall
    rollup: ScriptCall
    cancel: ScriptCall
    delayed_find: ScriptCall
    dlq_trim: ScriptCall
    dlq_fetch: ScriptCall
    flow_start: ScriptCall
    flow_add: ScriptCall
    dlq_replay: ScriptCall

    def __init__(self, client: Client) -> None:
        for name in NAMES:
            setattr(self, name, client.register_script(source(name)))
