"""What a live console tab watches: a *topic*.

Every page with live numbers watches one topic, and the same topic names its
websocket path (``/ws/live/<topic>/``), its polling endpoint
(``/live/<topic>/``) and the Channels group its fragments are sent to. A topic
is parsed from untrusted text, so it is validated here once and carried as a
value object afterwards.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from dataclasses import dataclass

from chasqui_core.engine.flows.batches import ID_PATTERN as BATCH_ID
from chasqui_core.engine.jobs.errors import InvalidQueueName
from chasqui_core.engine.store.keys import validate_queue_name

KINDS = ("overview", "queue", "dlq", "operation", "batch")

PROCESS_TOKEN = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
"""Tells this server process's groups from other processes' groups.

Each process runs its own sampler and sends only to its own sockets, so a
tab never receives the same numbers twice from two processes.
"""


class BadTopic(ValueError):
    """Text that does not name something the console can watch."""


@dataclass(frozen=True, slots=True, order=True)
class Topic:
    kind: str
    """One of KINDS."""
    arg: str = ""
    """The queue name (queue, dlq), operation id (operation) or batch id (batch); empty for the overview."""

    @classmethod
    def parse(cls, text: str) -> Topic:
        """``overview``, ``queue/<name>``, ``dlq/<name>``, ``operation/<uuid>`` or ``batch/<batch id>``."""
        kind, _, arg = text.strip("/").partition("/")
        if kind == "overview" and not arg:
            return cls("overview")
        if kind in ("queue", "dlq"):
            try:
                validate_queue_name(arg)
            except InvalidQueueName as exc:
                raise BadTopic(str(exc)) from None
            return cls(kind, arg)
        if kind == "operation":
            try:
                return cls(kind, str(uuid.UUID(arg)))
            except ValueError:
                raise BadTopic(f"{arg!r} is not an operation id") from None
        if kind == "batch":
            if not re.fullmatch(BATCH_ID, arg):
                raise BadTopic(f"{arg!r:.120} is not a batch id (expected <queue>:<id>)")
            return cls(kind, arg)
        raise BadTopic(f"Nothing to watch at {text!r}: use overview, queue/<name>, dlq/<name>, operation/<id> or "
                       "batch/<id>")

    @property
    def path(self) -> str:
        return f"{self.kind}/{self.arg}" if self.arg else self.kind

    @property
    def ws_url(self) -> str:
        return f"/ws/live/{self.path}/"

    @property
    def group(self) -> str:
        """The Channels group of this topic in this process (ASCII, under 100 characters)."""
        digest = hashlib.blake2b(self.path.encode(), digest_size=8).hexdigest()
        return f"chasqui-live.{PROCESS_TOKEN}.{self.kind}.{digest}"

    @property
    def queue(self) -> str | None:
        return self.arg if self.kind in ("queue", "dlq") else None
