"""Redis connections for the engine: one server, a Redis Cluster, or a Sentinel-watched master.

Workers and producers need binary-safe replies (payloads are msgpack), so the
clients never decode responses. hiredis, when installed, parses the replies.

Which kind of client a URL gets is decided here, so nothing else needs a
setting for it:

* ``redis+sentinel://`` (or ``rediss+sentinel://``) names Sentinels and a
  service: the client asks them for the master, and again after a failover.
* any other URL is asked, once per process, whether it is a node of a Redis
  Cluster (``CLUSTER INFO``); a cluster node gets redis-py's cluster client,
  which finds the other nodes itself. The answer is remembered per URL.

Settings that cannot work are refused here with one message naming what is
wrong (``RedisConfigError``): a database other than 0 on a cluster, TLS files
that do not exist, credentials the server refuses. The message shows the URL
with its password masked.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit

import redis
import redis.asyncio as aredis
import redis.asyncio.cluster as acluster
import redis.asyncio.sentinel as asentinel
import redis.cluster as rcluster
import redis.sentinel as sentinel

from chasqui_core.engine.jobs.errors import RedisConfigError

DEFAULT_URL = "redis://127.0.0.1:6379/0"

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")

TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")
"""redis-py's TLS options that name files: checked before connecting, so a typo is named, not a TLS handshake error."""

DETECT_TIMEOUT = 5.0
"""Seconds the one-off cluster question may take to connect, unless the URL sets ``socket_connect_timeout``."""

type Client = Any
"""A redis-py client, sync or asyncio, plain or cluster, as the function taking it says.

redis-py types each reply as the union of every shape a command can return
(and an awaitable, for the shared sync/async methods); the engine knows the
shape from the command it sent, so clients are typed loosely and everything
built from their replies strictly.
"""


# --- what a URL names ----------------------------------------------------------------------------


def masked(url: str) -> str:
    """The URL with its password (and any password in the query) replaced by ``***``: for messages."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        auth, _, hosts = netloc.rpartition("@")
        user, sep, _password = auth.partition(":")
        if sep:
            netloc = f"{user}:***@{hosts}"
    query = "&".join(
        f"{name}=***" if "password" in name.lower() else f"{name}={value}"
        for name, value in (pair.partition("=")[::2] for pair in parts.query.split("&") if pair)
    )
    return parts._replace(netloc=netloc, query=query).geturl()


def is_sentinel_url(url: str) -> bool:
    return urlsplit(url).scheme.lower() in SENTINEL_SCHEMES


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """What a ``redis+sentinel://`` URL names.

    ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?options]``:
    the Sentinels, the service (the master's name in their configuration) and
    the database. The user and password are the Redis server's; Sentinels that
    need a password of their own get ``sentinel_password=`` (and
    ``sentinel_username=``) in the query. Other query options are redis-py's
    connection options, as in a ``redis://`` URL. The ``rediss+sentinel``
    scheme connects to the master with TLS.
    """

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    tls: bool
    options: dict[str, Any]
    """Connection options for the master (credentials, query options)."""
    sentinel_options: dict[str, Any]
    """Connection options for the Sentinels themselves."""

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2]
        sentinels = []
        for item in hosts.split(","):
            host, _, port = item.strip().rpartition(":")
            if not host or not port.isdigit():
                raise RedisConfigError(f"{masked(url)}: each Sentinel must be written host:port, got {item!r}")
            sentinels.append((host.strip("[]"), int(port)))
        path = [unquote(p) for p in parts.path.split("/") if p]
        if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
            raise RedisConfigError(f"{masked(url)}: a Sentinel URL ends with /<service name>, or /<service name>/<db>; "
                                   "the service is the master's name in the Sentinels' configuration")
        options: dict[str, Any] = {}
        if parts.username:
            options["username"] = unquote(parts.username)
        if parts.password:
            options["password"] = unquote(parts.password)
        sentinel_options: dict[str, Any] = {}
        for name, values in parse_qs(parts.query).items():
            if name in ("sentinel_password", "sentinel_username"):
                sentinel_options[name.removeprefix("sentinel_")] = values[-1]
            else:
                options[name] = _query_value(name, values[-1])
        return cls(tuple(sentinels), path[0], int(path[1]) if len(path) == 2 else 0,
                   parts.scheme.lower() == "rediss+sentinel", options, sentinel_options)


def _query_value(name: str, value: str) -> Any:
    """A query option as redis-py's ``from_url`` would cast it."""
    parser: Any = redis.connection.URL_QUERY_ARGUMENT_PARSERS.get(name)
    if parser is None:
        return value
    try:
        return parser(value)
    except (TypeError, ValueError):
        raise RedisConfigError(f"Redis URL option {name}={value!r} is not valid") from None


def check_tls_files(url: str, kwargs: dict[str, Any]) -> None:
    """Refuse TLS options (in the URL's query or the keyword arguments) naming files that are not there."""
    named = {name: values[-1] for name, values in parse_qs(urlsplit(url).query).items() if name in TLS_FILES}
    named.update({name: kwargs[name] for name in TLS_FILES if kwargs.get(name)})
    for name, path in named.items():
        if not os.path.exists(path):
            raise RedisConfigError(f"{masked(url)}: {name} names {path!r}, which does not exist "
                                   "(the TLS files must be readable where the process runs)")


def _db_of(url: str) -> int:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    # a unix:// URL's path is its socket: its database is given as ?db= only
    path_db = "0" if parts.scheme.lower() == "unix" else (parts.path.strip("/") or "0")
    raw = query["db"][-1] if "db" in query else path_db
    try:
        return int(raw)
    except ValueError:
        raise RedisConfigError(f"{masked(url)}: the database must be a number, got {raw!r}") from None


# --- is it a cluster? ------------------------------------------------------------------------------

_kinds: dict[str, bool] = {}
_kinds_lock = threading.Lock()


def _cluster_reply(reply: Any) -> bool:
    """Whether a CLUSTER INFO reply (text), or an INFO cluster reply (parsed by redis-py), is a cluster node's."""
    if isinstance(reply, dict):
        return str(reply.get("cluster_enabled")) == "1"
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    return "cluster_state:" in text


def _refusal(url: str, exc: BaseException) -> RedisConfigError | None:
    """The clear error for a refusal no retry can fix (credentials, permissions); None for other errors."""
    if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in str(exc) or "NOAUTH" in str(exc):
        return RedisConfigError(f"{masked(url)}: the server refused the URL's credentials ({exc}). "
                                "Check the user name and password (redis://user:password@host:port/0).")
    if isinstance(exc, redis.exceptions.NoPermissionError) or str(exc).startswith("NOPERM"):
        return RedisConfigError(f"{masked(url)}: the user may not run a command Chasqui needs ({exc}); "
                                "docs/cluster.md lists the permissions each process needs.")
    return None


def _detection_kwargs(url: str) -> dict[str, Any]:
    query = parse_qs(urlsplit(url).query)
    return {} if "socket_connect_timeout" in query else {"socket_connect_timeout": DETECT_TIMEOUT}


def _probe_url(url: str) -> str:
    """``url`` on database 0: the question is asked before any database is chosen (a cluster may have only 0)."""
    parts = urlsplit(url)
    query = urlencode([(name, value) for name, value in parse_qsl(parts.query) if name != "db"])
    return parts._replace(path="/0", query=query).geturl()


def _ask_cluster_sync(url: str, kwargs: dict[str, Any]) -> bool:
    probe: Any = redis.Redis.from_url(_probe_url(url), single_connection_client=True,
                                      **{**_detection_kwargs(url), **kwargs})
    try:
        try:
            return _cluster_reply(probe.execute_command("CLUSTER", "INFO"))
        except redis.ResponseError as exc:
            if "cluster support disabled" in str(exc) or "unknown command" in str(exc).lower():
                return False
            if isinstance(exc, redis.exceptions.NoPermissionError):  # a user without CLUSTER INFO: INFO says it too
                return _cluster_reply(probe.info("cluster"))
            raise
    finally:
        probe.close()


async def _ask_cluster_async(url: str, kwargs: dict[str, Any]) -> bool:
    probe: Any = aredis.Redis.from_url(_probe_url(url), single_connection_client=True,
                                       **{**_detection_kwargs(url), **kwargs})
    try:
        try:
            return _cluster_reply(await probe.execute_command("CLUSTER", "INFO"))
        except redis.ResponseError as exc:
            if "cluster support disabled" in str(exc) or "unknown command" in str(exc).lower():
                return False
            if isinstance(exc, redis.exceptions.NoPermissionError):
                return _cluster_reply(await probe.info("cluster"))
            raise
    finally:
        await probe.aclose()


def _plain_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments that matter to the one-off question (credentials, TLS, timeouts)."""
    return {k: v for k, v in kwargs.items() if k not in ("retry", "health_check_interval", "single_connection_client")}


def _known_kind(url: str, kwargs: dict[str, Any]) -> bool | None:
    """Whether ``url`` is a cluster's when that is known without asking the server; else None (settings checked)."""
    known = _kinds.get(url)
    if known is not None:
        return known
    if is_sentinel_url(url) or urlsplit(url).scheme == "unix":  # no cluster behind a Unix socket
        return False
    _check(url, kwargs)
    return None


def is_cluster(url: str, **kwargs: Any) -> bool:
    """Whether ``url`` names a node of a Redis Cluster; asked once per process and URL.

    An unreachable server is not remembered: redis-py's connection error is
    raised, and the next call asks again.
    """
    known = _known_kind(url, kwargs)
    if known is not None:
        return known
    try:
        answer = _ask_cluster_sync(url, _plain_kwargs(kwargs))
    except redis.RedisError as exc:
        refusal = _refusal(url, exc)
        if refusal is not None:
            raise refusal from None
        raise
    return _remember(url, answer)


async def ais_cluster(url: str, **kwargs: Any) -> bool:
    """``is_cluster`` without blocking the event loop."""
    known = _known_kind(url, kwargs)
    if known is not None:
        return known
    try:
        answer = await _ask_cluster_async(url, _plain_kwargs(kwargs))
    except redis.RedisError as exc:
        refusal = _refusal(url, exc)
        if refusal is not None:
            raise refusal from None
        raise
    return _remember(url, answer)


def _cluster_database(url: str) -> RedisConfigError:
    return RedisConfigError(f"{masked(url)} is a Redis Cluster node, and a cluster has only database 0: "
                            "drop the database number from the URL (or make it /0)")


def _remember(url: str, answer: bool) -> bool:
    if answer and _db_of(url) != 0:
        raise _cluster_database(url)
    with _kinds_lock:
        _kinds[url] = answer
    return answer


def _check(url: str, kwargs: dict[str, Any]) -> None:
    check_tls_files(url, kwargs)
    _db_of(url)


def check_url(url: str) -> None:
    """Refuse, without connecting, a URL that cannot work: a Sentinel URL's shape, a database, TLS files."""
    if is_sentinel_url(url):
        spec = SentinelURL.parse(url)
        check_tls_files(url, spec.options)
    else:
        _check(url, {})


def check(url: str) -> None:
    """Raise ``RedisConfigError`` now for a URL that cannot work: for a process to call at start.

    Files, the URL's shape, the credentials (and, on a cluster, the database)
    are checked; a server that does not answer is not an error here: it may
    be restarting, and the process's own retries deal with that.
    """
    if is_sentinel_url(url):
        SentinelURL.parse(url)
        client = connect(url, socket_connect_timeout=DETECT_TIMEOUT)
        try:
            client.ping()
        except redis.RedisError as exc:
            refusal = _refusal(url, exc)
            if refusal is not None:
                raise refusal from None
        finally:
            client.close()
        return
    with contextlib.suppress(redis.RedisError):
        is_cluster(url)


def forget(url: str | None = None) -> None:
    """Forget what was learnt about ``url`` (every URL when None): the next connect asks again."""
    with _kinds_lock:
        if url is None:
            _kinds.clear()
        else:
            _kinds.pop(url, None)


# --- clients ----------------------------------------------------------------------------------------


def _kind(url: str, kwargs: dict[str, Any]) -> bool | None:
    """Whether ``url`` is a cluster's; None when the server does not answer (so nobody knows yet)."""
    try:
        return is_cluster(url, **kwargs)
    except (redis.ConnectionError, redis.TimeoutError):
        return None


def undetected(client: Any) -> bool:
    """True for a client made while its server did not answer: plain, though the server may be a cluster.

    It works as a plain client (its calls fail, or ride out the outage,
    as they would have); whoever keeps clients for long makes a new one
    once the server answers (``connect`` asks again).
    """
    return bool(getattr(client, "chasqui_undetected", False))


def connect(url: str | None = None, *, cluster: bool | None = None, **kwargs: Any) -> Any:
    """A sync client for ``url``: ``redis.Redis``, ``redis.cluster.RedisCluster``, or a Sentinel master's.

    ``cluster`` says what the URL is when the caller knows (from a client it
    already has); None asks the server, and a server that does not answer
    gets a plain client marked ``undetected``. ``retry`` (a ``redis.retry.Retry``)
    sets redis-py's own retries; on a cluster it is the cluster client's.
    """
    return _client(url, cluster, kwargs, sentinel.Sentinel, rcluster.RedisCluster, redis.Redis)


def aconnect(url: str | None = None, *, cluster: bool | None = None, **kwargs: Any) -> Any:
    """An asyncio client for ``url`` (see ``connect``).

    Deciding whether the URL is a cluster's may take one round trip, done
    blocking the first time a process meets the URL; async code calls
    ``await ais_cluster(url)`` first (or passes ``cluster``) so it never blocks.
    """
    return _client(url, cluster, kwargs, asentinel.Sentinel, acluster.RedisCluster, aredis.Redis)


def _client(url: str | None, cluster: bool | None, kwargs: dict[str, Any], sentinel_manager: Any,
            cluster_class: Any, plain_class: Any) -> Any:
    """``connect`` and ``aconnect``, given the sync or asyncio classes of each kind of client."""
    url = url or DEFAULT_URL
    if is_sentinel_url(url):
        client: Any = _sentinel_master(url, kwargs, sentinel_manager)
    else:
        known = _kind(url, kwargs) if cluster is None else cluster
        if known:
            kwargs.pop("single_connection_client", None)
            try:
                client = cluster_class.from_url(url, decode_responses=False, **kwargs)
            except redis.RedisError as exc:  # a sync client meets the cluster as it is made
                raise _refusal(url, exc) or exc from None
        else:
            check_tls_files(url, kwargs)
            client = plain_class.from_url(url, decode_responses=False, **kwargs)
            client.chasqui_undetected = known is None
    client.chasqui_url = url
    return client


def _sentinel_master(url: str, kwargs: dict[str, Any], manager: Any) -> Any:
    spec = SentinelURL.parse(url)
    options = {**spec.options, **kwargs}
    check_tls_files(url, options)
    if spec.tls:
        options["ssl"] = True
    sentinel_options = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel_options.update(spec.sentinel_options)
    single = options.pop("single_connection_client", False)
    sentinels = manager(list(spec.sentinels), sentinel_kwargs=sentinel_options)
    client = sentinels.master_for(spec.service, db=spec.db, decode_responses=False, **options)
    if single:  # master_for hands every option to the connections; this one is the client's
        client = type(client)(connection_pool=client.connection_pool, single_connection_client=True)
    return client


def node_url(url: str, host: str, port: int) -> str:
    """``url`` (a cluster's) pointing at one node: same credentials, TLS options and query, database 0."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return parts._replace(netloc=f"{auth}@{where}" if auth else where, path="/0").geturl()


def is_cluster_client(client: Any) -> bool:
    return isinstance(client, (rcluster.RedisCluster, acluster.RedisCluster,
                               rcluster.ClusterPipeline, acluster.ClusterPipeline))


def url_of(client: Any) -> str:
    """The URL a client was made from, so a sync client can get an asyncio twin."""
    known = getattr(client, "chasqui_url", None)
    if known:
        return str(known)
    if is_cluster_client(client):
        node = client.get_default_node()
        kw = client.nodes_manager.connection_kwargs
        host, port = node.host, node.port
    else:
        kw = client.connection_pool.connection_kwargs
        if "path" in kw:
            return f"unix://{kw['path']}?db={kw.get('db', 0)}"
        host, port = kw.get("host", "127.0.0.1"), kw.get("port", 6379)
    auth = ""
    if kw.get("password"):
        user = kw.get("username") or ""
        auth = f"{user}:{kw['password']}@"
    scheme = "rediss" if kw.get("ssl") or "ssl_context" in kw or "ssl_ca_certs" in kw else "redis"
    return f"{scheme}://{auth}{host}:{port}/{kw.get('db', 0)}"


def server_of(client_or_connection: Any) -> str:
    """``host:port`` (or the Unix socket path) of a client or connection, never its password: for messages."""
    if is_cluster_client(client_or_connection):
        nodes = client_or_connection.get_primaries() or client_or_connection.get_nodes()
        return "cluster " + ",".join(f"{n.host}:{n.port}" for n in nodes)
    pool = getattr(client_or_connection, "connection_pool", None)
    if pool is None:  # a connection
        conn = client_or_connection
        path = getattr(conn, "path", None)
        return f"unix:{path}" if path else f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"
    if isinstance(pool, (sentinel.SentinelConnectionPool, asentinel.SentinelConnectionPool)):
        return f"sentinel service {pool.service_name}"
    kw = pool.connection_kwargs
    if kw.get("path"):
        return f"unix:{kw['path']}"
    return f"{kw.get('host', '127.0.0.1')}:{kw.get('port', 6379)}"


def decodes_responses(client: Any) -> bool:
    """Whether the client decodes replies to str (the engine's clients never do: payloads are msgpack)."""
    if is_cluster_client(client):
        return bool(client.get_encoder().decode_responses)
    return bool(client.connection_pool.connection_kwargs.get("decode_responses"))
