"""The Redis-compatible server the benchmarks run against.

By default a private Valkey started for this run, with the append-only file
off: benchmarks measure the queue, not the disk. With ``REDIS_URL`` set, that
server is used instead. Every scenario empties the database first, so a
database that already holds keys is refused unless the caller allows it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import redis

from chasqui_core.engine.store.connection import connect
from chasqui_core.engine.store.embedded import EmbeddedValkey

from .results import BenchError


@dataclass(frozen=True, slots=True)
class ServerInfo:
    url: str
    name: str
    """``Valkey`` or ``Redis``."""
    version: str
    embedded: bool
    appendonly: str
    """``yes``, ``no``, or ``unknown`` when the server refuses CONFIG GET."""

    @property
    def title(self) -> str:
        return f"{self.name} {self.version}"

    def describe(self) -> str:
        where = "embedded, started for this run" if self.embedded else f"REDIS_URL={_safe(self.url)}"
        aof = {"no": "append-only file OFF", "yes": "append-only file ON"}.get(
            self.appendonly, "append-only setting unknown")
        return f"{self.title} ({where}; {aof})"

    def to_dict(self) -> dict:
        return {"url": _safe(self.url), "name": self.name, "version": self.version,
                "embedded": self.embedded, "appendonly": self.appendonly}


def _safe(url: str) -> str:
    """The URL without its password, for printing."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


class BenchServer:
    """Start (or reach) the server; ``with BenchServer(...) as server:``."""

    def __init__(self, url: str | None = None, *, allow_flush: bool = False) -> None:
        self._given_url = url
        self.allow_flush = allow_flush
        self._embedded: EmbeddedValkey | None = None
        self._data_dir: str | None = None
        self.url = ""
        self.client: redis.Redis | None = None

    def __enter__(self) -> BenchServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._given_url:
            self.url = self._given_url
        else:
            self._data_dir = tempfile.mkdtemp(prefix="chasqui-bench-valkey-")
            self._embedded = EmbeddedValkey(self._data_dir, appendonly=False)
            self.url = self._embedded.start()
        self.client = connect(self.url)
        try:
            self.client.ping()
        except redis.RedisError as exc:
            raise BenchError(f"cannot reach the server at {_safe(self.url)}: {exc}") from None
        if self._given_url and not self.allow_flush:
            keys = self.client.dbsize()
            if keys:
                db = self.client.connection_pool.connection_kwargs.get("db", 0)
                raise BenchError(
                    f"REDIS_URL points at database {db}, which holds {keys} keys. The benchmarks empty their "
                    "database (FLUSHDB) before every scenario, so they refuse to start on one with data in it. "
                    "Point REDIS_URL at an empty database (for example redis://127.0.0.1:6379/15), "
                    "or pass --flush to allow emptying this one."
                )

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self._embedded is not None:
            self._embedded.stop()
            self._embedded = None
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    def flush(self) -> None:
        self.client.flushdb()

    def info(self) -> ServerInfo:
        server = self.client.info("server")
        if "valkey_version" in server:
            name, version = "Valkey", str(server["valkey_version"])
        else:
            name, version = "Redis", str(server.get("redis_version", "unknown"))
        try:
            config = self.client.config_get("appendonly")
            reply = {k.decode() if isinstance(k, bytes) else k: v for k, v in config.items()}
            appendonly = reply.get("appendonly", "unknown")
            appendonly = appendonly.decode() if isinstance(appendonly, bytes) else str(appendonly)
        except redis.RedisError:
            appendonly = "unknown"
        return ServerInfo(self.url, name, version, self._embedded is not None, appendonly)

    def used_memory_mb(self) -> float:
        return int(self.client.info("memory")["used_memory"]) / 1e6

    def export_url(self) -> None:
        """Hand the URL to child processes and to Django's settings (read from the environment)."""
        os.environ["REDIS_URL"] = self.url
