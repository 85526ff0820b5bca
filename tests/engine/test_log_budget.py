"""A worker's per-job log lines are capped per second, and what was held back is still counted."""

import logging

from chasqui_core.engine.worker.log_budget import LogBudget


def test_lines_over_the_budget_are_counted_in_one_summary(caplog):
    logger = logging.getLogger("chasqui.test-budget")
    budget = LogBudget(logger, "retries", per_second=3)
    allowed = [budget.allow() for _ in range(10)]
    assert allowed == [True] * 3 + [False] * 7
    with caplog.at_level(logging.INFO, logger="chasqui.test-budget"):
        budget.summarise()
        budget.summarise()  # nothing more held back: no second line
    assert [r.getMessage() for r in caplog.records] == [
        "... and 7 more retries since the last such line, not logged one by one"]
