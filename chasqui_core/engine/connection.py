"""Redis connections for the engine.

Workers and producers need binary-safe replies (payloads are msgpack), so the
clients never decode responses. hiredis, when installed, parses the replies.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aredis

DEFAULT_URL = "redis://127.0.0.1:6379/0"

type Client = Any
"""A redis-py client, sync or asyncio, as the function taking it says.

redis-py types each reply as the union of every shape a command can return
(and an awaitable, for the shared sync/async methods); the engine knows the
shape from the command it sent, so clients are typed loosely and everything
built from their replies strictly.
"""


def connect(url: str | None = None, **kwargs: Any) -> redis.Redis:
    return redis.Redis.from_url(url or DEFAULT_URL, decode_responses=False, **kwargs)


def aconnect(url: str | None = None, **kwargs: Any) -> aredis.Redis:
    return aredis.Redis.from_url(url or DEFAULT_URL, decode_responses=False, **kwargs)


def url_of(client: redis.Redis | aredis.Redis) -> str:
    """Rebuild a URL from a client, so a sync client can get an asyncio twin."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    auth = ""
    if kw.get("password"):
        user = kw.get("username") or ""
        auth = f"{user}:{kw['password']}@"
    scheme = "rediss" if kw.get("ssl") or "ssl_context" in kw else "redis"
    return f"{scheme}://{auth}{kw.get('host', '127.0.0.1')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def server_of(client_or_connection: Any) -> str:
    """``host:port`` (or the Unix socket path) of a client or connection, never its password: for messages."""
    pool = getattr(client_or_connection, "connection_pool", None)
    if pool is None:  # a connection
        conn = client_or_connection
        path = getattr(conn, "path", None)
        return f"unix:{path}" if path else f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"
    kw = pool.connection_kwargs
    if kw.get("path"):
        return f"unix:{kw['path']}"
    return f"{kw.get('host', '127.0.0.1')}:{kw.get('port', 6379)}"
