"""The results page and table show each Django-path row against its engine twin.

Built from measurements made up here, so no server is needed: what is checked
is the rendering, not any speed.
"""

from __future__ import annotations

from bench import report
from bench.results import RATE, Measurement
from bench.runner import Run

MACHINE = {"cpu": "test CPU", "cores": 2, "usable_cores": 2, "python": "CPython", "redis_py": "x", "hiredis": "x",
           "msgpack": "x", "os": "Linux", "load_at_start": "0.00, 0.00, 0.00"}
SERVER = {"url": "redis://127.0.0.1:1/0", "name": "Valkey", "version": "9", "embedded": True, "appendonly": "no"}


def rate(label: str, value: float, scenario: str | None = None) -> Measurement:
    return Measurement(scenario or label, label, RATE, [value], jobs=100)


def a_run() -> Run:
    return Run(MACHINE, SERVER, smoke=False, repeats=1, command="python -m bench", started_at=0.0, failures={},
               measurements=[
                   rate("Redis ceiling (pipelined XADD)", 400_000.0, "ceiling"),
                   rate("queue-add", 20_000.0),
                   rate("bare XADD round trip (beside queue-add)", 25_000.0, "queue-add"),
                   rate("worker-concurrent", 80_000.0),
                   rate("django-enqueue (loop)", 10_000.0, "django-enqueue"),
                   rate("queue-add (beside django-enqueue)", 20_000.0, "django-enqueue"),
                   Measurement("django-enqueue-many", "django-enqueue-many", RATE,
                               skipped="not available: this version's Django tasks have no enqueue_many()"),
                   rate("runworker-async", 60_000.0),
               ])


def test_a_django_path_row_is_shown_as_a_fraction_of_its_twin():
    rows = {r[0]: r for r in report.rows(a_run())}
    twin_column = report.COLUMNS.index("of engine twin")
    assert rows["django-enqueue (loop)"][twin_column] == "0.50 of queue-add (beside django-enqueue)"
    assert rows["queue-add"][twin_column] == "0.80 of bare XADD round trip (beside queue-add)"
    assert rows["worker-concurrent"][twin_column] == "—"  # an engine row with no yardstick of its own


def test_a_twin_missing_from_the_run_is_named_and_a_skipped_row_says_so():
    rows = {r[0]: r for r in report.rows(a_run())}
    twin_column = report.COLUMNS.index("of engine twin")
    assert rows["runworker-async"][twin_column] == "— (worker-concurrent (beside runworker-async) not in this run)"
    assert rows["django-enqueue-many"][1] == "skipped"
    markdown = report.markdown(a_run())
    assert "- **django-enqueue-many**: not available: this version's Django tasks have no enqueue_many()" in markdown


def test_worker_rows_also_compare_cpu_per_job_with_their_twin():
    run = a_run()
    run.measurements += [
        Measurement("runworker-sync", "runworker-sync", RATE, [50_000.0], jobs=100, cpu_us_per_job=12.0),
        Measurement("runworker-sync", "worker-sync (beside runworker-sync)", RATE, [100_000.0], jobs=100,
                    cpu_us_per_job=10.0),
    ]
    rows = {r[0]: r for r in report.rows(run)}
    assert (rows["runworker-sync"][report.COLUMNS.index("of engine twin")]
            == "0.50 of worker-sync (beside runworker-sync) (CPU per job ×1.20)")
    items = {m["label"]: m for m in report.to_json(run)["measurements"]}
    assert items["runworker-sync"]["cpu_per_job_of_twin"] == 1.2
    assert items["django-enqueue (loop)"]["cpu_per_job_of_twin"] is None


def test_json_names_the_twin_and_the_fraction():
    items = {m["label"]: m for m in report.to_json(a_run())["measurements"]}
    assert items["django-enqueue (loop)"]["engine_twin"] == "queue-add (beside django-enqueue)"
    assert items["django-enqueue (loop)"]["fraction_of_twin"] == 0.5
    assert items["runworker-async"]["engine_twin"] == "worker-concurrent (beside runworker-async)"
    assert items["runworker-async"]["fraction_of_twin"] is None
    assert items["queue-add"]["engine_twin"] == "bare XADD round trip (beside queue-add)"
    assert "engine_twin" not in items["worker-concurrent"]


def test_the_results_page_describes_every_django_path_scenario():
    markdown = report.markdown(a_run())
    for name in ("django-enqueue", "django-enqueue-many", "runworker-async", "runworker-sync", "runworker-retry"):
        assert f"| `{name}` |" in markdown, name
    assert "*of engine twin*" in markdown
    assert "**The Django path.**" in markdown


def a_run_with_bounded_goals() -> Run:
    run = a_run()
    run.measurements += [
        rate("worker-retry", 20_000.0),
        rate("worker-concurrent (beside worker-retry)", 80_000.0, "worker-retry"),
        rate("promoter", 330_000.0),
        rate("runworker-retry", 15_000.0),
        rate("worker-retry (beside runworker-retry)", 25_000.0, "runworker-retry"),
    ]
    return run


def test_a_rate_goal_is_set_against_the_most_its_run_allowed():
    reach = {r.label: r for r in report.reaches(a_run_with_bounded_goals())}
    # every job runs twice: half the noop drain beside it, below the 50,000 asked
    assert reach["worker-retry"].most == 40_000.0
    assert not reach["worker-retry"].within_reach
    # the promoter writes each job with an XADD: the ceiling row
    assert reach["promoter"].most == 400_000.0
    assert reach["promoter"].bound_by == "Redis ceiling (pipelined XADD)"
    assert not reach["promoter"].within_reach
    # the Django path cannot outrun the engine twin drained in turns with it
    assert reach["runworker-retry"].most == 25_000.0
    assert reach["runworker-retry"].within_reach
    # runworker-async's twin is not in this run: no bound is made up for it
    assert "runworker-async" not in reach


def test_the_page_and_the_json_say_whether_each_bounded_goal_was_in_reach():
    run = a_run_with_bounded_goals()
    markdown = report.markdown(run)
    assert "### Goals against what this run allowed" in markdown
    line = next(x for x in markdown.splitlines() if x.startswith("- `worker-retry` (goal"))
    assert "50,000 jobs/s asked, 20,000 jobs/s measured, out of reach on this host in this run" in line
    assert "0.5 of `worker-concurrent (beside worker-retry)`" in line
    assert "reached 0.50 of that" in line
    line = next(x for x in markdown.splitlines() if x.startswith("- `runworker-retry` (goal"))
    assert "15,000 jobs/s measured, not met, within reach" in line
    items = {m["label"]: m for m in report.to_json(run)["measurements"]}
    assert items["worker-retry"]["goal_limit"] == {"bound_by": "worker-concurrent (beside worker-retry)",
                                                   "share": 0.5, "most": 40_000.0, "within_reach": False}
    assert "goal_limit" not in items["queue-add"]


def test_a_run_without_bounded_goals_has_no_such_section():
    assert "### Goals against what this run allowed" not in report.markdown(a_run())


def test_a_goal_reached_is_called_met():
    run = a_run_with_bounded_goals()
    run.measurements += [rate("worker-concurrent (beside runworker-async)", 70_000.0, "runworker-async")]
    line = next(x for x in report.markdown(run).splitlines() if x.startswith("- `runworker-async` (goal"))
    assert "60,000 jobs/s asked, 60,000 jobs/s measured, met." in line
