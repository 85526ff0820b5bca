"""The engine's Lua scripts, loaded once from the ``lua/`` folder beside this file.

Each script is sent by SHA (EVALSHA) and loaded on first use; redis-py's
Script objects do that for plain clients, pipelines and asyncio clients alike.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_LUA_DIR = Path(__file__).with_name("lua")

NAMES = ("enqueue", "settle", "promote", "lock", "reclaim", "dlq_move", "delayed_move", "lease", "delayed_stats")


@cache
def source(name: str) -> str:
    return (_LUA_DIR / f"{name}.lua").read_text()


class Scripts:
    """Registered scripts for one client (sync or asyncio)."""

    def __init__(self, client) -> None:
        for name in NAMES:
            setattr(self, name, client.register_script(source(name)))
