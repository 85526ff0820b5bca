"""The engine's Lua scripts, loaded once from the ``lua/`` folder beside this file.

Each script is sent by SHA (EVALSHA) and loaded on first use; redis-py's
Script objects do that for plain clients, pipelines and asyncio clients alike.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from .connection import Client

_LUA_DIR = Path(__file__).with_name("lua")

NAMES = ("enqueue", "settle", "promote", "lock", "reclaim", "dlq_move", "delayed_move", "lease", "delayed_stats")


@cache
def source(name: str) -> str:
    return (_LUA_DIR / f"{name}.lua").read_text()


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

    def __init__(self, client: Client) -> None:
        for name in NAMES:
            setattr(self, name, client.register_script(source(name)))
