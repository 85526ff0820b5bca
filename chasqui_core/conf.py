"""Chasqui's Django settings, read once and checked.

Engine-wide settings live in ``settings.CHASQUI`` (a dict); per-backend ones
in the backend's ``TASKS[...]["OPTIONS"]``. Every key is validated, so a typo
or a wrong type is reported at start-up in words, not as a stack trace in a
worker at 3 a.m.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from chasqui_core.engine.jobs.backoff import DEFAULT_BACKOFF, BackoffSpec, coerce_backoff
from chasqui_core.engine.jobs import idempotency, redact
from chasqui_core.engine.store.connection import DEFAULT_URL, check_url
from chasqui_core.engine.dlq.retention import Retention
from chasqui_core.engine.store.keys import validate_queue_name
from chasqui_core.engine.jobs.errors import RedisConfigError
from chasqui_core.engine.worker.limits import Limit, LimitError, parse_limits
from chasqui_core.engine.jobs.signing import check_keys


@dataclass(frozen=True, slots=True)
class ChasquiSettings:
    REDIS_URL: str | None = None
    """None (not given): settings.REDIS_URL, else the REDIS_URL environment variable, else 127.0.0.1:6379. Given
    but empty is a mistake (chasqui.E003), never a silent default."""
    CONCURRENCY: int = 10
    BATCH_SIZE: int = 100
    MAX_ATTEMPTS: int = 3
    BACKOFF: Any = None
    VISIBILITY_TIMEOUT_MS: int = 30_000
    PROMOTER_POLL_INTERVAL: float = 0.1
    PROMOTER_LOCK_TTL_MS: int = 5_000
    SHUTDOWN_TIMEOUT: float = 25.0
    JOB_TIMEOUT: float | None = None
    """Seconds a run may take when neither the job nor its task sets a timeout; None: no limit."""
    CANCEL_GRACE: float = 10.0
    """Seconds a running sync job may go on once told it is cancelled, before it is given up like a timeout."""
    PRIORITY: str = "strict"
    """Which fetched job a worker starts next: "strict" (highest priority band first) or "weighted" (6:3:1)."""
    DEAD_WORKER_GRACE_MS: int = 600_000
    """Workers silent this long leave the consumer group and the workers list, once their jobs are reclaimed."""
    MAX_PAYLOAD_BYTES: int = 1024 * 1024
    BACKGROUND_THRESHOLD: int = 2000
    """Filtered DLQ operations touching more entries than this run in the background."""
    ENQUEUE_RETRY_SECONDS: float = 5.0
    """How long enqueue() keeps retrying while Redis is unavailable (restart, failover); 0 turns retries off."""
    OPENTELEMETRY: bool = True
    """Spans for enqueues and runs when opentelemetry-api is installed (django-chasqui[otel]); False: none,
    and no trace context in the jobs (chasqui_core/tracing.py)."""
    MASKED_KEYS: tuple[str, ...] = ()
    """More key names whose values are masked (case-insensitive, substring match), on top of the built-in
    list in chasqui_core.engine.jobs.redact.SECRET_KEYS (password, pwd, token, api_key, private_key, session,
    cookie, authorization, credentials...)."""
    METRICS_ALLOWED_IPS: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    """Client addresses or networks ("10.0.0.7", "10.0.0.0/8", "fd00::/8") that may read /metrics without an
    API key: the Prometheus servers, when giving them a key is awkward. Matched against the address Django
    sees as the client's (see TRUSTED_PROXIES)."""
    TRUSTED_PROXIES: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    """Addresses or networks of the reverse proxies in front of the site. A request from one of them is
    taken to come from the address its X-Forwarded-For names (read from the right, past every trusted
    proxy); from anywhere else the header is ignored, since a client can send any. Empty: REMOTE_ADDR is the
    client. Used for the limit on wrong API keys and for METRICS_ALLOWED_IPS."""
    SIGNING_KEYS: tuple[bytes, ...] = ()
    """Keys (str or bytes) that sign jobs: producers sign with the first, workers run only jobs signed with
    one of them. Empty: jobs are neither signed nor checked. See docs/security.md."""
    IDEMPOTENCY_TTL: int = idempotency.DEFAULT_TTL
    """Seconds a completed idempotency key is remembered (``task.using(idempotency_key=...)``), unless the
    job says otherwise with ``idempotency_ttl``."""

    LIMITS: tuple[Limit, ...] = ()
    """Rate and concurrency limits by queue name or task path: ``{"emails": {"rate": "20/s"},
    "shop.tasks.call_api": {"rate": "100/m", "concurrency": 2, "key": "customer_id"}}``. Enforced by the
    workers, in Redis, across every process (docs/flow-control.md)."""

    DLQ_MAX_ENTRIES: int | None = None
    """Every queue's DLQ keeps at most this many dead jobs, the newest (the oldest are trimmed); None: no count."""
    DLQ_MAX_AGE_DAYS: float | None = None
    """Every queue's DLQ keeps dead jobs this many days after they died; None: no age limit."""
    DLQ_RETENTION: Mapping[str, Retention] = field(default_factory=dict)
    """Per queue, overriding the two above key by key: ``{"emails": {"max_entries": 10_000, "max_age_days": 30}}``
    (None for a key: no limit of that kind on that queue). See docs/settings.md."""

    def dlq_retention(self, queue: str) -> Retention:
        """The retention rule of ``queue``'s DLQ: its own entry in DLQ_RETENTION, else the defaults."""
        return self.DLQ_RETENTION.get(queue) or Retention(self.DLQ_MAX_ENTRIES, self.DLQ_MAX_AGE_DAYS)

    SCHEDULES: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Repeatable jobs by name: ``{"nightly-report": {"task": "reports.tasks.nightly", "cron": "0 3 * * *",
    "timezone": "America/Lima"}}``. Checked in full (tasks included) by chasqui_core/schedules.py."""

    def metrics_allowed(self, address: str) -> bool:
        """Whether a request from ``address`` may read /metrics without a key."""
        return in_networks(address, self.METRICS_ALLOWED_IPS)

    def client_address(self, remote_addr: str, forwarded_for: str | None) -> str:
        """The address a request comes from: REMOTE_ADDR, or behind trusted proxies what they forwarded.

        X-Forwarded-For is read from the right: each proxy appends the address
        it heard from, so the rightmost entry not of a trusted proxy is the
        first one a trusted proxy vouches for; what lies left of it is the
        client's to write.
        """
        if not forwarded_for or not in_networks(remote_addr, self.TRUSTED_PROXIES):
            return remote_addr
        hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not in_networks(hop, self.TRUSTED_PROXIES):
                return hop
        return hops[0] if hops else remote_addr

    def _redis_url_source(self) -> tuple[Any, str]:
        """The Redis URL as given, and the setting it came from: the first of them that is set at all."""
        if self.REDIS_URL is not None:
            return self.REDIS_URL, "settings.CHASQUI['REDIS_URL']"
        if hasattr(settings, "REDIS_URL"):
            return settings.REDIS_URL, "settings.REDIS_URL"
        if "REDIS_URL" in os.environ:
            return os.environ["REDIS_URL"], "the REDIS_URL environment variable"
        return DEFAULT_URL, f"the default Redis URL ({DEFAULT_URL}; set REDIS_URL)"

    @property
    def redis_url(self) -> str:
        url, _ = self._redis_url_source()
        return url.strip() if isinstance(url, str) and url.strip() else DEFAULT_URL

    @property
    def redis_url_setting(self) -> str:
        """Where ``redis_url`` came from, for messages about it."""
        return self._redis_url_source()[1]

    @property
    def redis_url_problem(self) -> str | None:
        """Why the Redis URL cannot name a server, in words naming its setting; None when it can.

        An empty or non-string value, a scheme no client uses, a port out of
        range, a database that is not a number of 0 or more, TLS files that
        are not there: all that can be told without a server. Reported by the
        ``chasqui.E003`` system check, and raised by the first connection in a
        process that ran no checks.
        """
        url, setting = self._redis_url_source()
        if not isinstance(url, str):
            return (f"{setting} must be a string such as 'redis://127.0.0.1:6379/0', got "
                    f"{type(url).__name__} {redact.mask_text(repr(url))}.")
        if not url.strip():
            return (f"{setting} is empty: give a Redis URL such as 'redis://127.0.0.1:6379/0', or leave it unset "
                    f"(Chasqui then looks further: settings.CHASQUI['REDIS_URL'], settings.REDIS_URL, the REDIS_URL "
                    f"environment variable, {DEFAULT_URL}).")
        return scheme_problem(url.strip(), setting) or shape_problem(url.strip(), setting)

    @property
    def backoff(self) -> BackoffSpec:
        return coerce_backoff(self.BACKOFF) or DEFAULT_BACKOFF


def in_networks(address: str, networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> bool:
    """Whether ``address`` (a string, perhaps not an address at all) is in one of ``networks``."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # "::ffff:10.0.0.7" from a dual-stack socket
    return any(ip in network or (mapped is not None and mapped in network) for network in networks)


REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
"""The URL schemes a Chasqui client connects with (chasqui_core.engine.store.connection)."""


def scheme_problem(url: str, setting: str) -> str | None:
    """The one message for a Redis URL whose scheme no client uses, or None when its scheme is accepted.

    redis-py's own complaint for ``http://...`` is a bare ValueError at the
    first enqueue, and a URL missing its colon (``redis//host``) reads as a
    bad database number; both are the scheme, and this says so first.
    """
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    if scheme in REDIS_SCHEMES:
        return None
    accepted = ", ".join(f"{s}://" for s in REDIS_SCHEMES)
    found = f"its scheme is {scheme + '://'!r}" if scheme else "it has no scheme"
    return (f"{setting} is {redact.mask_text(url)!r}, and {found}: a Redis URL starts with one of {accepted} "
            "(e.g. redis://127.0.0.1:6379/0; rediss:// for TLS).")


def shape_problem(url: str, setting: str) -> str | None:
    """What is wrong with a Redis URL of an accepted scheme that no server could fix: port, database, TLS files."""
    parts = urlsplit(url)
    if parts.scheme.lower() in ("redis", "rediss"):
        try:
            port = parts.port
        except ValueError:
            port = -1
        if port is not None and not 1 <= port <= 65535:
            return (f"{setting} is {redact.mask_text(url)!r}: its port must be a number from 1 to 65535 "
                    "(e.g. redis://127.0.0.1:6379/0).")
        database = parts.path.strip("/")
        if database and not database.isdigit():
            return (f"{setting} is {redact.mask_text(url)!r}: the database after the host must be a number of 0 or "
                    f"more (e.g. redis://127.0.0.1:6379/0), got {database!r}.")
    try:
        check_url(url)
    except RedisConfigError as exc:
        return f"{setting}: {exc}"
    return None


_POSITIVE_INTS = ("CONCURRENCY", "BATCH_SIZE", "MAX_ATTEMPTS", "VISIBILITY_TIMEOUT_MS", "PROMOTER_LOCK_TTL_MS",
                  "MAX_PAYLOAD_BYTES", "BACKGROUND_THRESHOLD", "DEAD_WORKER_GRACE_MS")
_POSITIVE_NUMBERS = ("PROMOTER_POLL_INTERVAL", "SHUTDOWN_TIMEOUT")


def _retention_rules(rules: Any, default: Retention) -> dict[str, Retention]:
    """DLQ_RETENTION checked: queue names, known keys, sound values; each rule filled in from the defaults."""
    name = "settings.CHASQUI['DLQ_RETENTION']"
    if rules is None:
        return {}
    if not isinstance(rules, Mapping):
        raise ImproperlyConfigured(f"{name} must be a dict of rules by queue name, e.g. "
                                   "{'emails': {'max_entries': 10000, 'max_age_days': 30}}")
    out: dict[str, Retention] = {}
    for queue, rule in rules.items():
        try:
            validate_queue_name(queue)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {exc}") from None
        where = f"{name}[{queue!r}]"
        if isinstance(rule, Mapping):
            rule = {"max_entries": default.max_entries, "max_age_days": default.max_age_days, **rule}
        try:
            out[queue] = Retention.from_dict(dict(rule) if isinstance(rule, Mapping) else rule, where)
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None
    return out


def load(raw: dict[str, Any] | None = None) -> ChasquiSettings:
    raw = dict(getattr(settings, "CHASQUI", {}) if raw is None else raw)
    known = {f.name for f in fields(ChasquiSettings)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ImproperlyConfigured(
            f"settings.CHASQUI has unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}"
        )
    for key in _POSITIVE_INTS:
        if key in raw and (isinstance(raw[key], bool) or not isinstance(raw[key], int) or raw[key] < 1):
            raise ImproperlyConfigured(
                f"settings.CHASQUI[{key!r}] must be a whole number of 1 or more, got {raw[key]!r}")
    for key in _POSITIVE_NUMBERS:
        if key in raw and (isinstance(raw[key], bool) or not isinstance(raw[key], (int, float)) or raw[key] <= 0):
            raise ImproperlyConfigured(f"settings.CHASQUI[{key!r}] must be a number above 0, got {raw[key]!r}")
    if "OPENTELEMETRY" in raw and not isinstance(raw["OPENTELEMETRY"], bool):
        raise ImproperlyConfigured(
            f"settings.CHASQUI['OPENTELEMETRY'] must be True or False, got {raw['OPENTELEMETRY']!r}")
    if "ENQUEUE_RETRY_SECONDS" in raw:
        value = raw["ENQUEUE_RETRY_SECONDS"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 3600:
            raise ImproperlyConfigured(
                f"settings.CHASQUI['ENQUEUE_RETRY_SECONDS'] must be a number of seconds from 0 to 3600, got {value!r}")
    if raw.get("JOB_TIMEOUT") is not None:
        value = raw["JOB_TIMEOUT"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 366 * 24 * 3600:
            raise ImproperlyConfigured(
                f"settings.CHASQUI['JOB_TIMEOUT'] must be a number of seconds above 0 (or None), got {value!r}")
    if "CANCEL_GRACE" in raw:
        value = raw["CANCEL_GRACE"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 366 * 24 * 3600:
            raise ImproperlyConfigured(
                f"settings.CHASQUI['CANCEL_GRACE'] must be a number of seconds, 0 or more, got {value!r}")
    if "PRIORITY" in raw and raw["PRIORITY"] not in ("strict", "weighted"):
        raise ImproperlyConfigured(
            f"settings.CHASQUI['PRIORITY'] must be 'strict' (the highest priority first) or 'weighted' (high, default "
            f"and low priority take 6, 3 and 1 of every 10 starts), got {raw['PRIORITY']!r}")
    if "MASKED_KEYS" in raw:
        keys = raw["MASKED_KEYS"]
        if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
            raise ImproperlyConfigured("settings.CHASQUI['MASKED_KEYS'] must be a list of key names")
        raw["MASKED_KEYS"] = tuple(k.lower() for k in keys)
    for key in ("METRICS_ALLOWED_IPS", "TRUSTED_PROXIES"):
        if key in raw:
            raw[key] = _networks(raw[key], f"settings.CHASQUI[{key!r}]")
    if "SCHEDULES" in raw:
        schedules = raw["SCHEDULES"]
        if not isinstance(schedules, Mapping) or not all(isinstance(v, Mapping) for v in schedules.values()):
            raise ImproperlyConfigured(
                "settings.CHASQUI['SCHEDULES'] must be a dict of schedules by name, each a dict such as "
                "{'task': 'reports.tasks.nightly', 'cron': '0 3 * * *'}")
    if "LIMITS" in raw:
        try:
            raw["LIMITS"] = tuple(parse_limits(raw["LIMITS"] or {}))
        except LimitError as exc:
            raise ImproperlyConfigured(f"settings.CHASQUI['LIMITS']: {exc}") from None
    for key, part in (("DLQ_MAX_ENTRIES", "max_entries"), ("DLQ_MAX_AGE_DAYS", "max_age_days")):
        try:
            Retention(**{part: raw.get(key)})
        except ValueError as exc:
            raise ImproperlyConfigured(f"settings.CHASQUI[{key!r}]: {exc}") from None
    default = Retention(raw.get("DLQ_MAX_ENTRIES"), raw.get("DLQ_MAX_AGE_DAYS"))
    if "DLQ_RETENTION" in raw:
        raw["DLQ_RETENTION"] = _retention_rules(raw["DLQ_RETENTION"], default)
    if "SIGNING_KEYS" in raw:
        keys = raw["SIGNING_KEYS"]
        try:
            raw["SIGNING_KEYS"] = () if keys is None else check_keys(keys, "settings.CHASQUI['SIGNING_KEYS']")
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None
    if "IDEMPOTENCY_TTL" in raw:
        try:
            idempotency.check_ttl(raw["IDEMPOTENCY_TTL"], "settings.CHASQUI['IDEMPOTENCY_TTL']")
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None
    if raw.get("BACKOFF") is not None:
        try:
            coerce_backoff(raw["BACKOFF"])
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"settings.CHASQUI['BACKOFF'] is not valid: {exc}") from None
    # The Redis URL is not refused here: the chasqui.E003 system check reports what is wrong with it
    # (redis_url_problem), and the first connection of a process that ran no checks refuses it.
    return ChasquiSettings(**raw)


def _networks(value: Any, name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ImproperlyConfigured(f"{name} must be a list of IP addresses or networks, e.g. ['10.0.0.7', "
                                   f"'10.1.0.0/16'], got {value!r}")
    out = []
    for item in value:
        try:
            out.append(ipaddress.ip_network(item.strip() if isinstance(item, str) else item))
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(
                f"{name} holds {item!r}, which is not an IP address or network (e.g. '10.0.0.7' or "
                f"'10.1.0.0/16', with the host bits of a network at zero): {exc}") from None
    return tuple(out)


_current: ChasquiSettings | None = None


def chasqui_settings() -> ChasquiSettings:
    """The validated settings, read once (and again after a settings change in tests)."""
    global _current
    if _current is None:
        _current = load()
        redact.add_keys(_current.MASKED_KEYS)
    return _current


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    global _current
    if setting in ("CHASQUI", "REDIS_URL"):
        _current = None
        from django.tasks import task_backends

        for backend in task_backends.all():
            if hasattr(backend, "reset_connections"):
                backend.reset_connections()


@dataclass(frozen=True, slots=True)
class KeyFailurePolicy:
    """How many wrong API keys an address may send with one key prefix in a window before it is told 429."""

    limit: int = 20
    window: int = 300


def key_failure_policy() -> KeyFailurePolicy:
    """``API_KEY_FAILURE_LIMIT`` and ``API_KEY_FAILURE_WINDOW``, top-level settings, checked.

    Read at each wrong key (tests change them), and by the ``chasqui.E005``
    check, so a wrong type is a check error naming the setting rather than a
    TypeError quoted to an API client.
    """
    values = {}
    for name, default in (("API_KEY_FAILURE_LIMIT", 20), ("API_KEY_FAILURE_WINDOW", 300)):
        value = getattr(settings, name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ImproperlyConfigured(f"settings.{name} must be a whole number of 1 or more, got {value!r}")
        values[name] = value
    return KeyFailurePolicy(values["API_KEY_FAILURE_LIMIT"], values["API_KEY_FAILURE_WINDOW"])
