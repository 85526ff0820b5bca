"""A budget of log lines per second, for messages a busy worker could print thousands of times a second.

A worker retrying 20,000 jobs a second cannot print a line for each without
spending most of its time writing logs, and nobody reads them at that rate.
The first lines of each second are logged in full; the rest are counted and
summed up in one line when the next second starts, so the log still says
how many there were.
"""

from __future__ import annotations

import logging
import time


class LogBudget:
    def __init__(self, logger: logging.Logger, what: str, per_second: int = 20) -> None:
        self.logger = logger
        self.what = what
        self.per_second = per_second
        self._second = 0
        self._used = 0
        self._held_back = 0

    def allow(self) -> bool:
        """True when this line may be logged; False when it only counts toward the next summary."""
        second = int(time.monotonic())
        if second != self._second:
            self.summarise()
            self._second = second
            self._used = 0
        if self._used < self.per_second:
            self._used += 1
            return True
        self._held_back += 1
        return False

    def summarise(self) -> None:
        """Log how many lines were held back since the last summary, if any."""
        if self._held_back:
            self.logger.info("... and %d more %s since the last such line, not logged one by one", self._held_back,
                             self.what)
            self._held_back = 0
