"""What Chasqui keeps in the database: API keys, the audit log, background
operations, and the permissions that guard every change.

Jobs themselves live in Redis; the database holds only what must outlast a
Redis flush and answer "who did what": an operator's key, a record of each
change, and the progress of long sweeps that a web request cannot wait for.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

from django.conf import settings
from django.db import models

KEY_PREFIX_LENGTH = 8
"""Characters of an API key kept in clear, to tell keys apart in lists."""


class QueueAccess(models.Model):
    """Holds Chasqui's permissions; it has no table and no rows.

    Django permissions hang off a model. The actions they guard are about
    queues in Redis, not about rows, so they sit on this placeholder.
    """

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_queues", "View queues, jobs, workers and the audit log"),
            ("enqueue_jobs", "Enqueue jobs and run delayed jobs now"),
            ("replay_jobs", "Replay dead jobs"),
            ("discard_jobs", "Discard dead jobs and cancel delayed jobs"),
            ("pause_queues", "Pause and resume queues"),
        ]

    def __str__(self) -> str:
        return "Chasqui queue access"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class ApiKey(models.Model):
    """A bearer key acting as its user. Only a hash is stored: a leaked
    database does not leak working keys."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chasqui_api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=KEY_PREFIX_LENGTH, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        label = f" ({self.name})" if self.name else ""
        return f"{self.prefix}…{label} for {self.user}"

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    @classmethod
    def issue(cls, user, name: str = "") -> tuple[ApiKey, str]:
        """Create a key; returns the row and the key, which is shown once and never again."""
        key = secrets.token_urlsafe(32)
        while key.startswith("-"):  # a key shown as "-Ab3..." would read as an option to `chasqui apikey revoke`
            key = secrets.token_urlsafe(32)
        row = cls.objects.create(user=user, name=name, prefix=key[:KEY_PREFIX_LENGTH], key_hash=hash_key(key))
        return row, key


class AuditEntry(models.Model):
    """One change made by an operator, through the API, the console or the CLI."""

    class Action(models.TextChoices):
        REPLAY = "replay"
        DISCARD = "discard"
        PAUSE = "pause"
        RESUME = "resume"
        CANCEL_DELAYED = "cancel_delayed"
        RUN_DELAYED_NOW = "run_delayed_now"
        ENQUEUE = "enqueue"
        CANCEL_OPERATION = "cancel_operation"
        APIKEY_CREATE = "apikey_create"
        APIKEY_REVOKE = "apikey_revoke"
        SCHEDULE_PAUSE = "schedule_pause"
        SCHEDULE_RESUME = "schedule_resume"
        SCHEDULE_RUN = "schedule_run"
        WORKER_QUIET = "worker_quiet"
        WORKER_STOP = "worker_stop"
        PURGE = "purge"
        CANCEL_JOB = "cancel_job"

    class Source(models.TextChoices):
        API = "api"
        CONSOLE = "console"
        CLI = "cli"

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    actor_repr = models.CharField(max_length=200)
    """Who acted, as text: stays readable after the user is deleted."""
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    action = models.CharField(max_length=32, choices=Action.choices, db_index=True)
    queue = models.CharField(max_length=100, blank=True, db_index=True)
    source = models.CharField(max_length=16, choices=Source.choices)
    target_ids = models.JSONField(default=list, blank=True)
    """The ids acted on (entry, job or key ids), cut to the first MAX_TARGET_IDS."""
    filter = models.JSONField(default=dict, blank=True)
    count = models.IntegerField(default=0)
    """How many entries the change touched."""
    detail = models.JSONField(default=dict, blank=True)

    MAX_TARGET_IDS = 100

    class Meta:
        verbose_name = "audit entry"
        verbose_name_plural = "audit log"
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        where = f" on {self.queue}" if self.queue else ""
        return f"{self.actor_repr} {self.action}{where} ({self.count})"


class Operation(models.Model):
    """A replay or discard by filter too big for one request, run by a worker of its queue.

    The lasting record operators list; the live progress is the engine's record in Redis
    (``engine/dlq/operations.py``), copied onto this row whenever it is read (``services/background.py``).
    """

    class Kind(models.TextChoices):
        REPLAY = "replay"
        DISCARD = "discard"

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        CANCELLED = "cancelled"
        FAILED = "failed"

    FINISHED = (Status.DONE, Status.CANCELLED, Status.FAILED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    queue = models.CharField(max_length=100)
    filter = models.JSONField(default=dict, blank=True)
    options = models.JSONField(default=dict, blank=True)
    source = models.CharField(max_length=16, choices=AuditEntry.Source.choices, default=AuditEntry.Source.API)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    done = models.IntegerField(default=0)
    """Matching entries handled so far (including ones someone else removed meanwhile)."""
    total = models.IntegerField(default=0)
    """Matching entries when the sweep started."""
    count = models.IntegerField(default=0)
    """Entries this operation actually replayed or discarded (known when it finishes)."""
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(null=True, blank=True)
    """When the row was last brought up to date from the operation's progress in Redis."""
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} on {self.queue}: {self.status} {self.done}/{self.total}"

    @property
    def finished(self) -> bool:
        return self.status in self.FINISHED


class OutboxEntry(models.Model):
    """A job written in the same database transaction as the data it is about.

    With the backend's ``OUTBOX`` option on, an enqueue inside
    ``transaction.atomic()`` becomes a row here instead of a Redis write. The
    row commits or rolls back with the caller's data; once committed it is
    relayed to Redis right away, or, if Redis is down at that moment, by the
    outbox relay that every worker runs. Relaying is idempotent: the job's id
    is its idempotency key.
    """

    queue = models.CharField(max_length=100)
    job_id = models.CharField(max_length=200, unique=True)
    payload = models.BinaryField()
    when = models.CharField(max_length=32, blank=True, help_text="'' = now, '@<epoch ms>' = delayed until")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]
        verbose_name = "outbox entry"
        verbose_name_plural = "outbox"

    def __str__(self) -> str:
        return f"{self.job_id} → {self.queue}"
