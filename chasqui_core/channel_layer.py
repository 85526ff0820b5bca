"""The console's channel layer on the project's Redis, chosen for the kind of Redis it is.

* One server: channels_redis's ``RedisChannelLayer``, as before.
* Behind Sentinel (``redis+sentinel://``): the same layer, given the
  Sentinels and the service, so it follows the master after a failover.
* A Redis Cluster: ``RedisChannelLayer`` keeps a group's members in keys of
  their own and acts on several in one script, which a cluster refuses
  (their slots differ). The console only broadcasts fragments to groups, and
  pub/sub is cluster-wide (a message published on any node reaches
  subscribers on every node), so channels_redis's ``RedisPubSubChannelLayer``
  is used, on the node the URL names. Nothing is stored: a fragment sent
  while a tab reconnects is simply replaced by the next one.

Settings name ``redis_channel_layer`` as the layer's BACKEND with the URL in
``hosts``; channels calls it with the CONFIG, as it would a class.
"""

from __future__ import annotations

from typing import Any

from channels_redis.core import RedisChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer

from chasqui_core.engine.store.connection import SentinelURL, is_cluster, is_sentinel_url


def redis_channel_layer(hosts: list[Any], **config: Any) -> Any:
    """The channel layer for ``hosts`` (a one-URL list from settings; anything else goes to RedisChannelLayer as is)."""
    url = hosts[0] if len(hosts) == 1 and isinstance(hosts[0], str) else None
    if url is None:
        return RedisChannelLayer(hosts=hosts, **config)
    if is_sentinel_url(url):
        spec = SentinelURL.parse(url)
        host = {"sentinels": list(spec.sentinels), "master_name": spec.service, "db": spec.db,
                "sentinel_kwargs": spec.sentinel_options or None, **spec.options}
        if spec.tls:
            host["ssl"] = True
        return RedisChannelLayer(hosts=[host], **config)
    if is_cluster(url):
        return RedisPubSubChannelLayer(hosts=[url], **config)
    return RedisChannelLayer(hosts=hosts, **config)
