"""A leader lock: one holder at a time for a job only one process should do.

The promoter of each queue and the scheduler each elect their leader this
way: SET NX PX takes the lock, ``lock.lua`` renews and releases it only for
the holder that owns it (compare-and-expire, compare-and-delete). A holder
renews every third of the lock's life, so a leader that dies is replaced
within one TTL and a live one never lets it lapse.
"""

from __future__ import annotations

import contextlib
import logging
import time

from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.scripts import Scripts


class LeaderLock:
    def __init__(self, client: Client, scripts: Scripts, key: str, holder: str, ttl_ms: int, *,
                 logger: logging.Logger, label: str, won_level: int = logging.INFO) -> None:
        self.client = client
        self.scripts = scripts
        self.key = key
        self.holder = holder
        self.ttl_ms = ttl_ms
        self.held = False
        """Whether this holder leads, as of the last take, renewal or script that checked the lock."""
        self._logger = logger
        self._label = label
        """Who holds it, for the log lines: ``promoter for emails``, ``scheduler <worker id>``."""
        self._won_level = won_level
        self._renewed_at = 0.0

    async def acquire_or_renew(self) -> bool:
        """Take the lock when free, or renew it when held and a third of its life has passed; whether held."""
        if self.held:
            if time.monotonic() - self._renewed_at >= self.ttl_ms / 3000:
                self.held = bool(await self.scripts.lock(keys=[self.key], args=["renew", self.holder, self.ttl_ms]))
                self._renewed_at = time.monotonic()
                if not self.held:
                    self._logger.info("%s lost its lock", self._label)
        elif await self.client.set(self.key, self.holder, nx=True, px=self.ttl_ms):
            self.held = True
            self._renewed_at = time.monotonic()
            self._logger.log(self._won_level, "%s is now the leader", self._label)
        return self.held

    async def release(self) -> None:
        """Give the lock up, if held (only this holder's lock is deleted)."""
        if self.held:
            with contextlib.suppress(Exception):
                await self.scripts.lock(keys=[self.key], args=["release", self.holder, 0])
            self.held = False
