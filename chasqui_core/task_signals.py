"""Django's task signals, sent at the cost of a function call when nothing needs more.

``task_enqueued``, ``task_started`` and ``task_finished`` go out for every job.
Sent the plain way from the worker's event loop (``Signal.asend``), each costs
a ``sync_to_async`` thread hop, because Django's own receivers, the ones that
log each job, are synchronous: two hops per job capped a worker at a few
thousand jobs a second.

Django's logging receivers are known code that only calls a logger, which is
safe anywhere, so they are called inline, and skipped outright when their
logger would drop the record anyway. Any other receiver a project connects is
sent exactly as Django sends it, in Django's order: ``send`` from a thread,
``asend`` from the loop, so a user's synchronous receiver never runs on the
event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal
from django.tasks import TaskResult, TaskResultStatus
from django.tasks import signals as django_signals

_logger = logging.getLogger("django.tasks")

_ANY_STATUS = tuple(TaskResultStatus)
_LOGGING_RECEIVERS: dict[Callable[..., Any], dict[TaskResultStatus, int]] = {
    django_signals.log_task_started: dict.fromkeys(_ANY_STATUS, logging.INFO),
    django_signals.log_task_finished: {**dict.fromkeys(_ANY_STATUS, logging.INFO),
                                       TaskResultStatus.FAILED: logging.ERROR},
    django_signals.log_task_enqueued: dict.fromkeys(_ANY_STATUS, logging.DEBUG),
}
"""Django's own receivers, with the level each logs a result of each status at."""


class TaskSignal:
    """One of Django's task signals, from one sender.

    ``wanted(status)`` says whether sending would reach anything at all, so the
    caller can skip building the TaskResult; ``send``/``asend`` send it.
    """

    def __init__(self, signal: Signal, sender: type) -> None:
        self.signal = signal
        self.sender = sender
        self._seen: list[Any] | None = None
        self._logging: list[tuple[Callable[..., Any], dict[TaskResultStatus, int]]] = []
        self._lowest: dict[TaskResultStatus, int] = {}
        """Per status, the lowest level a logging receiver logs it at (no entry: none is connected)."""
        self._plain = True

    def _refresh(self) -> None:
        """Look at the connected receivers again if they changed since last time.

        Comparing the receiver list with a copy is a few pointer comparisons,
        far cheaper than resolving every weak reference on every job.
        """
        signal = self.signal
        if self._seen is not None and not signal._dead_receivers and signal.receivers == self._seen:
            return
        sync_receivers, async_receivers = signal._live_receivers(self.sender)
        self._plain = not async_receivers and all(r in _LOGGING_RECEIVERS for r in sync_receivers)
        self._logging = [(r, _LOGGING_RECEIVERS[r]) for r in sync_receivers] if self._plain else []
        self._lowest = {status: min(levels[status] for _, levels in self._logging)
                        for status in _ANY_STATUS} if self._logging else {}
        self._seen = list(signal.receivers)

    def wanted(self, status: TaskResultStatus) -> bool:
        """Would a result with this status reach a receiver that acts on it?

        Runs for every job, so the unchanged-receivers check is written out
        here and the answer is one lookup and one ``isEnabledFor``.
        """
        signal = self.signal
        if self._seen is None or signal._dead_receivers or signal.receivers != self._seen:
            self._refresh()
        if not self._plain:
            return True
        level = self._lowest.get(status)
        return level is not None and _logger.isEnabledFor(level)

    def send(self, task_result: TaskResult) -> None:
        """From synchronous code (a worker thread, a view)."""
        self._refresh()
        if self._plain:
            self._log(task_result)
        else:
            self.signal.send(self.sender, task_result=task_result)

    async def asend(self, task_result: TaskResult) -> None:
        """From the event loop: inline when only Django's logging listens, else Django's own asend."""
        self._refresh()
        if self._plain:
            self._log(task_result)
        else:
            await self.signal.asend(self.sender, task_result=task_result)

    def _log(self, task_result: TaskResult) -> None:
        for receiver, levels in self._logging:
            if _logger.isEnabledFor(levels[task_result.status]):
                receiver(signal=self.signal, sender=self.sender, task_result=task_result)
