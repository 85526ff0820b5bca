"""Django's Redis cache on the project's Redis, whatever kind it is: one server, a Cluster, or behind Sentinel.

Django's own ``RedisCache`` speaks to one server through a connection pool
of its own. Here the client comes from the engine's ``connect()``, which
recognises a cluster node's URL and a ``redis+sentinel://`` URL, so the
cache (the API's count of wrong keys lives in it) needs no setting of its
own. On a cluster the few multi-key calls are spread by slot: ``get_many``
reads key by key in one pipeline per node, ``set_many`` writes without MSET,
and ``clear`` empties every master.
"""

from __future__ import annotations

from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient

from chasqui_core.engine.store.connection import connect, is_cluster_client


class AnyRedisCacheClient(RedisCacheClient):
    """Django's cache client on the engine's client for the first server's URL."""

    def __init__(self, servers: list[str], **options: Any) -> None:
        super().__init__(servers, **options)
        self._shared: Any = None

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        if self._shared is None:
            self._shared = connect(self._servers[0])
        return self._shared

    @property
    def _cluster(self) -> bool:
        return is_cluster_client(self.get_client())

    def get_many(self, keys: Any) -> dict[Any, Any]:
        if not self._cluster:
            return super().get_many(keys)
        keys = list(keys)
        values = self.get_client().mget_nonatomic(keys)
        return {k: self._serializer.loads(v) for k, v in zip(keys, values, strict=True) if v is not None}

    def set_many(self, data: dict[Any, Any], timeout: int | None) -> None:
        if not self._cluster:
            super().set_many(data, timeout)
            return
        pipe = self.get_client().pipeline(transaction=False)
        for key, value in data.items():
            pipe.set(key, self._serializer.dumps(value), ex=timeout)
        pipe.execute()

    def clear(self) -> bool:
        client = self.get_client()
        if is_cluster_client(client):
            return bool(client.flushdb(target_nodes=client.PRIMARIES))
        return bool(client.flushdb())


class RedisCache(DjangoRedisCache):
    """``django.core.cache.backends.redis.RedisCache`` for a plain server, a cluster or Sentinel (LOCATION: one URL)."""

    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = AnyRedisCacheClient
