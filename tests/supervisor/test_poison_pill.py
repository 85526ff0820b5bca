"""A poison pill under ``runworker --processes 2 --concurrency 4``: only the pill is dead-lettered.

A sync task that kills its process takes with it the runs beside it. Those
neighbours are charged that death (they were running), so they run alone
next, and the pill's second death is its own. Measured before that rule, the
pill went to the DLQ after two deaths with two neighbours that never finished a
run. Here, as operators run it: a supervisor, its children, 50 jobs of 0.1 s.
"""

from __future__ import annotations

import pytest

from chasqui_core.engine.jobs.envelope import decode
from chasqui_core.engine.producer.queue import Queue
from tests.supervisor.app import DONE, DOZE, PILL, QUEUE, STARTED
from tests.supervisor.processes import KEYS
from tests.supervisor.processes import runs as _runs


@pytest.mark.timeout(600)
def test_a_pill_among_fifty_jobs_dead_letters_only_itself_at_concurrency_4_in_two_processes(start, redis):
    q = Queue(QUEUE, redis_client=redis)
    neighbours = [f"n{i}" for i in range(50)]
    for key in neighbours[:20]:
        q.add(DOZE, [key, 0.1])
    pill = q.add(PILL, attempts=10).job_id  # the budget is no way out: only the poison-pill rule stops it
    for key in neighbours[20:]:
        q.add(DOZE, [key, 0.1])
    supervisor = start("--processes", "2", "--concurrency", "4", "--visibility-timeout", "2000")

    def settled():
        done = {job for job, _ in _runs(redis, DONE)}
        return redis.xlen(KEYS.dlq) >= 1 and set(neighbours) <= done

    supervisor.wait("every neighbour finishes and the pill is dead-lettered", settled, timeout=300)
    dead = {decode(fields[b"j"]).id: fields[b"reason"] for _, fields in redis.xrange(KEYS.dlq)}
    assert dead == {pill: b"panic"}, f"only the pill may be dead-lettered: {dead}"
    pill_runs = [pid for job, pid in _runs(redis, STARTED) if job == "pill"]
    assert len(pill_runs) == 2, f"the pill ran (and killed its process) twice: {pill_runs}"
    assert "exited with code 1; restarting now" in supervisor.log()
    assert supervisor.stop() == 0
