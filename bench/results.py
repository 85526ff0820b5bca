"""What a scenario reports: one ``Measurement`` per row of the results table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .stats import median

RATE = "jobs/s"


class BenchError(RuntimeError):
    """A scenario could not measure what it claims to; the message says why."""


@dataclass(slots=True)
class Measurement:
    scenario: str
    """The scenario that produced it (``peers`` rows name the scenario they mirror)."""
    label: str
    """The table row, e.g. ``worker-concurrent`` or ``latency p99 @ 500/s``."""
    unit: str
    samples: list[float] = field(default_factory=list)
    """One value per measured repeat; the warm-up is never among them."""
    system: str = "chasqui"
    """``chasqui``, or the peer measured on the same server (``rq``, ``arq``)."""
    jobs: int = 0
    """Jobs per measured repeat."""
    note: str = ""
    skipped: str = ""
    """Why nothing was measured (a missing optional package, for instance)."""
    lower_is_better: bool = False
    cpu_us_per_job: float | None = None
    """Worker rows: the worker process's CPU time per job (median of the repeats), steadier than wall-clock rates
    on a shared machine."""

    @property
    def median(self) -> float | None:
        return median(self.samples) if self.samples else None

    @property
    def is_rate(self) -> bool:
        return self.unit == RATE

    def to_dict(self) -> dict:
        data = asdict(self)
        data["median"] = self.median
        return data
