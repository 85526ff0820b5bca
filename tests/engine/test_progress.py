"""Progress reports of running jobs: checked at the call, written by the worker's poll, the latest winning."""

import pytest

from chasqui_core.engine.jobs import progress
from chasqui_core.engine.producer.queue import Queue
from tests.engine.worker_app import DONE_SUFFIX, RUNS_KEY, wait_for


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "50%", None, True])
def test_a_report_that_is_not_a_finite_number_is_refused(value):
    with pytest.raises(TypeError, match="finite number"):
        progress.check(value, "")


def test_a_long_message_is_cut_and_a_non_string_refused():
    assert progress.check(3, "x" * 1000) == (3.0, "x" * progress.MESSAGE_MAX)
    with pytest.raises(TypeError, match="message"):
        progress.check(3, 7)


def test_a_running_job_reports_progress_and_its_last_report_outlasts_the_run(redis, workers):
    workers.start("p-run")
    job = Queue("p-run", redis_client=redis).add("obedient", kwargs={"seconds": 2})
    seen = wait_for(lambda: progress.read(redis, "p-run", job.job_id), 20, "a first report while it runs")
    assert 0 <= seen.value < 100 and seen.message.startswith("step ")
    wait_for(lambda: job.job_id.encode() in redis.lrange(RUNS_KEY + DONE_SUFFIX, 0, -1), 20, "the run to end")
    # reports made 20 times a second are written at most twice a second, the latest winning: the last one stays
    last = wait_for(lambda: (p := progress.read(redis, "p-run", job.job_id)) and p.message == "step 39 of 40" and p,
                    10, "the last report")
    assert last.value == pytest.approx(97.5)
    assert 0 < redis.pttl(f"{{chasqui:p-run}}:progress:{job.job_id}") <= progress.TTL_MS
