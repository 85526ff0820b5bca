"""The supervisor's tests' fixture: ``start`` runs a ``runworker`` supervisor and kills what it left at the end."""

from __future__ import annotations

import pytest

from tests.supervisor.processes import Supervised


@pytest.fixture
def start(tmp_path, redis_url, redis):
    started: list[Supervised] = []

    def start_supervisor(*args: str, env: dict[str, str] | None = None) -> Supervised:
        supervised = Supervised(tmp_path, redis_url, *args, env=env)
        started.append(supervised)
        return supervised

    yield start_supervisor
    for supervised in started:
        supervised.kill_everything()
