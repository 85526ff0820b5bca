"""The soak's accounting (bench/soak/verdict.py) flags every kind of discrepancy, and nothing else.

Fed with ledgers written here line by line (through the soak's own reader,
so the reader is tested too), dead-letter entries and process deaths made
up for each case: no server is needed, the point is the judging.
"""

from __future__ import annotations

import pytest

from bench.soak.kinds import BY_NAME, KINDS
from bench.soak.ledger import LedgerWriter, read
from bench.soak.verdict import DeadEntry
from bench.soak.verdict_report import report_discrepancies, table
from tests.bench.soak_book import CRASHED_PID, KILLED_PID, T0, Book, a_clean_book, what


def test_a_clean_soak_has_no_discrepancy_and_its_table_adds_up():
    verdict = a_clean_book().judge()
    assert verdict.ok, report_discrepancies(verdict)
    rows = verdict.rows
    assert (rows["ok"].enqueued, rows["ok"].succeeded) == (1, 1)
    assert rows["always_fail"].dead == {"retries_exhausted": 1} and rows["always_fail"].max_runs == 3
    assert rows["crash"].lost_runs == 2 and rows["crash"].dead == {"panic": 1}
    assert sum(r.unsettled for r in rows.values()) == 0, "no run ended just before an abrupt death"
    assert rows["hang_sync"].lost_runs == 0, "a hanging run abandoned by its timeout is not a lost run"
    assert rows["scheduled"].succeeded == 1
    text = table(verdict, [k.name for k in KINDS])
    assert text.splitlines()[-1].split()[:4] == ["total", "6", "0", "3"]


def test_a_job_neither_succeeded_nor_dead_is_unaccounted():
    b = a_clean_book()
    b.enqueue("ok-2", "ok")
    b.enqueue("ok-3", "ok")
    b.run("ok-3", "ok", at=2, outcome="error", error_class="SoakFailure")
    assert what(b.judge()) == [("unaccounted", "ok-2"), ("unaccounted", "ok-3")]


def test_a_job_both_succeeded_and_dead_is_flagged():
    b = a_clean_book()
    b.dies("ok-1", "retries_exhausted", queue="soak-a")
    assert ("succeeded and dead", "ok-1") in what(b.judge())


def test_a_job_dead_twice_is_flagged():
    b = a_clean_book()
    b.dies("fail-1", "retries_exhausted")
    assert what(b.judge()) == [("dead twice", "fail-1")]


def test_runs_past_the_budget_are_flagged():
    b = a_clean_book()
    b.run("fail-1", "always_fail", at=9, outcome="error", error_class="SoakFailure")
    verdict = b.judge()
    assert what(verdict) == [("over budget", "fail-1")]
    assert "ran 4 times" in verdict.discrepancies[0].detail
    assert len(verdict.discrepancies[0].lines) == 5, "the job's four runs and its dead-letter entry are shown"


def test_one_more_run_is_allowed_when_a_run_s_outcome_was_lost_with_its_killed_process():
    b = Book()
    b.enqueue("fail-2", "always_fail")
    b.run("fail-2", "always_fail", at=1, outcome="error", error_class="SoakFailure")
    b.run("fail-2", "always_fail", at=2, outcome="error", error_class="SoakFailure")
    b.run("fail-2", "always_fail", at=3, outcome="error", error_class="SoakFailure", pid=KILLED_PID)
    b.run("fail-2", "always_fail", at=9, outcome="error", error_class="SoakFailure", attempt=3)
    b.dies("fail-2", "retries_exhausted")
    b.process_died(KILLED_PID, 3.3, killed=True)
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    assert (verdict.rows["always_fail"].lost_runs, verdict.rows["always_fail"].unsettled) == (0, 1)
    b.killed.discard(KILLED_PID)
    b.exited(KILLED_PID, 3.3)  # the same end, but a clean stop: it settled what it ran
    assert what(b.judge()) == [("over budget", "fail-2"), ("rerun without a lost outcome", "fail-2")]


def test_each_lost_run_the_engine_did_not_charge_allows_one_more_run_up_to_the_recoveries_before_a_panic():
    """A run lost with its process and followed by a run of the same attempt was not charged (its process died
    inside its round of starts, or its start mark never reached Redis): each allows one run more."""
    b = Book()
    b.enqueue("fail-4", "always_fail")
    for n, pid in enumerate((KILLED_PID, CRASHED_PID)):
        b.run("fail-4", "always_fail", at=1 + 3 * n, outcome=None, pid=pid, attempt=1)
    for at, attempt in ((7, 1), (8, 2), (9, 3)):
        b.run("fail-4", "always_fail", at=at, outcome="error", error_class="SoakFailure", attempt=attempt)
    b.dies("fail-4", "retries_exhausted")
    b.process_died(KILLED_PID, 1.5, killed=True)
    b.process_died(CRASHED_PID, 4.5, killed=True)
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    b.run("fail-4", "always_fail", at=10, outcome="error", error_class="SoakFailure")
    assert what(b.judge()) == [("over budget", "fail-4")]


def test_each_outcome_lost_with_an_abrupt_death_allows_one_more_run():
    """Two crashes, each just after the job's run ended: its outcome was lost twice, so it ran twice more."""
    b = Book()
    b.enqueue("fail-3", "always_fail")
    b.run("fail-3", "always_fail", at=1, outcome="error", error_class="SoakFailure", pid=KILLED_PID)
    b.run("fail-3", "always_fail", at=4, outcome="error", error_class="SoakFailure", pid=CRASHED_PID, attempt=1)
    for at, attempt in ((7, 1), (8, 2), (9, 3)):
        b.run("fail-3", "always_fail", at=at, outcome="error", error_class="SoakFailure", attempt=attempt)
    b.dies("fail-3", "retries_exhausted")
    b.process_died(KILLED_PID, 1.12, killed=True)
    b.process_died(CRASHED_PID, 4.12, killed=True)
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    assert verdict.rows["always_fail"].unsettled == 2
    b.run("fail-3", "always_fail", at=10, outcome="error", error_class="SoakFailure")
    assert what(b.judge()) == [("over budget", "fail-3")]


def test_replays_add_to_the_budget_a_whole_budget_or_one_run():
    b = a_clean_book()
    b.replay("fail-1", "always_fail", reset=True)
    for i in range(3):
        b.run("fail-1", "always_fail", at=20 + i, outcome="error", error_class="SoakFailure")
    b.enqueue("fix-1", "fixed_by_replay")
    b.run("fix-1", "fixed_by_replay", at=1, outcome="error", error_class="NotFixedYet")
    b.run("fix-1", "fixed_by_replay", at=2, outcome="error", error_class="NotFixedYet")
    b.replay("fix-1", "fixed_by_replay", reset=False)
    b.run("fix-1", "fixed_by_replay", at=12)
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    assert verdict.rows["always_fail"].replays == 1
    b.run("fix-1", "fixed_by_replay", at=13)
    assert what(b.judge()) == [("over budget", "fix-1"), ("ran after success", "fix-1")]


def test_a_run_lost_before_its_first_line_after_a_replay_that_reset_the_budget_is_a_note():
    """Seed 297275: after a whole-budget replay the job's runs went on as attempts 4 and 5, and the third of the new
    budget was charged WorkerLost: its process died after the engine marked it started and before the task's first
    line. The verdict looked for charged attempts only up to the first budget, found none missing, and blamed the
    runs that had ended before the replay ("finished run charged")."""
    b = a_clean_book()
    b.replay("fail-1", "always_fail", reset=True)
    b.run("fail-1", "always_fail", at=20, outcome="error", error_class="SoakFailure")
    b.run("fail-1", "always_fail", at=21, outcome="error", error_class="SoakFailure", pid=777)
    b.process_died(777, 26.0, killed=True)  # a crash job beside the next run, marked started, killed it
    b.dead[:] = [d for d in b.dead if d.job_id != "fail-1"]
    b.dies("fail-1", "retries_exhausted", error_class="chasqui_core.engine.jobs.errors.WorkerLost", at=34)
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    assert [(n.what, n.job_id) for n in verdict.notes] == [("charged before its first line", "fail-1")]


def test_a_replay_must_give_the_job_a_new_run():
    b = a_clean_book()
    b.replay("fail-1", "always_fail", reset=False)
    b.replay("fail-1", "always_fail", reset=False)
    b.run("fail-1", "always_fail", at=20, outcome="error", error_class="SoakFailure")
    b.run("fail-1", "always_fail", at=21, outcome="error", error_class="SoakFailure")
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    b.replay("fail-1", "always_fail", reset=False)
    b.replay("fail-1", "always_fail", reset=False)
    b.replay("fail-1", "always_fail", reset=False)
    assert ("replay not run", "fail-1") in what(b.judge())


def test_a_panic_without_two_lost_runs_is_a_false_panic():
    b = a_clean_book()
    b.enqueue("ok-2", "ok")
    b.run("ok-2", "ok", at=1, outcome=None, pid=KILLED_PID)
    b.process_died(KILLED_PID, 1.5, killed=True)
    b.dies("ok-2", "panic", "WorkerLost", "soak-a")
    assert what(b.judge()) == [("false panic", "ok-2")]
    b.run("ok-2", "ok", at=7, outcome=None, pid=KILLED_PID + 1)
    b.process_died(KILLED_PID + 1, 7.5, killed=True)
    assert b.judge().ok, "in flight at two deaths: a panic is what the engine promises"


def test_a_job_never_run_but_dead_as_panic_is_a_false_panic():
    b = a_clean_book()
    b.enqueue("ok-2", "ok")
    b.dies("ok-2", "panic", "WorkerLost", "soak-a")
    assert what(b.judge()) == [("false panic", "ok-2")]


def test_a_job_whose_runs_were_lost_at_three_deaths_went_past_the_poison_pill_limit():
    b = a_clean_book()
    b.run("crash-1", "crash", at=15, outcome=None, pid=CRASHED_PID + 2)
    b.process_died(CRASHED_PID + 2, 15.01)
    verdict = b.judge()
    assert what(verdict) == [("past the poison-pill limit", "crash-1")]
    assert "lost 3 charged runs" in verdict.discrepancies[0].detail


def test_a_lost_run_the_engine_did_not_charge_does_not_count_toward_the_poison_pill_limit():
    """Its start-journal mark never reached Redis (Redis was restarting): the job ran again as the same attempt."""
    b = Book()
    b.enqueue("crash-9", "crash")
    for n, (pid, attempt) in enumerate([(CRASHED_PID, 1), (CRASHED_PID + 1, 1), (CRASHED_PID + 2, 2)]):
        b.run("crash-9", "crash", at=10 + n, outcome=None, pid=pid, attempt=attempt)
        b.process_died(pid, 10 + n + 0.01)
    b.dies("crash-9", "panic", "WorkerLost", "soak-c")
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    b.run("crash-9", "crash", at=20, outcome=None, pid=CRASHED_PID + 3, attempt=3)
    b.process_died(CRASHED_PID + 3, 20.01)
    assert what(b.judge()) == [("past the poison-pill limit", "crash-9")]


def test_a_budget_spent_by_a_lost_run_is_retries_exhausted_with_worker_lost_only_when_a_run_was_lost():
    b = a_clean_book()
    b.enqueue("hang-2", "hang_async")
    b.run("hang-2", "hang_async", at=1, outcome="cancelled", error_class="CancelledError", took=2)
    b.run("hang-2", "hang_async", at=4, outcome=None, pid=KILLED_PID)
    b.process_died(KILLED_PID, 4.5, killed=True)
    b.dies("hang-2", "retries_exhausted", "WorkerLost", "soak-c")
    b.enqueue("ok-2", "ok")
    for at in (1, 2, 3):
        b.run("ok-2", "ok", at=at, outcome="error", error_class="SoakFailure")
    b.dies("ok-2", "retries_exhausted", "WorkerLost", "soak-a")
    assert what(b.judge()) == [("false worker lost", "ok-2")]


def test_a_wrong_dead_letter_reason_is_flagged():
    b = a_clean_book()
    b.enqueue("unrec-1", "unrecoverable")
    b.run("unrec-1", "unrecoverable", at=1, outcome="error", error_class="UnrecoverableError")
    b.dies("unrec-1", "bad_signature", "UnrecoverableError", "soak-c")
    b.enqueue("ok-2", "ok")
    b.run("ok-2", "ok", at=1, outcome="error", error_class="SoakFailure")
    b.dies("ok-2", "internal", "TypeError", "soak-a")
    assert what(b.judge()) == [("wrong reason", "ok-2"), ("wrong reason", "unrec-1")]


def test_a_hanging_job_must_be_charged_a_job_timeout():
    b = a_clean_book()
    b.dead[-1] = DeadEntry("hang-1", "soak-b", "retries_exhausted", "RuntimeError", "9-0", "boom")
    assert what(b.judge()) == [("wrong error", "hang-1")]


def test_a_budget_spent_by_lost_contact_is_right_only_when_a_run_was_under_way_while_the_workers_were_cut_off():
    b = a_clean_book()
    b.dead[-1] = DeadEntry("hang-1", "soak-b", "retries_exhausted", "chasqui_core.engine.jobs.errors.LostContact",
                           f"{int((T0 + 50) * 1000)}-0",
                           "contact with its worker was lost during run 2 of 2; no run is left")
    assert what(b.judge()) == [("false lost contact", "hang-1")]
    b.cut(30.0, 40.0)  # its second run hung past its timeout, its outcome not yet settled when the workers were cut off
    assert what(b.judge()) == []


def test_a_hanging_run_is_lost_only_when_its_process_died_before_the_timeout():
    b = Book()
    b.enqueue("hang-2", "hang_async")
    b.run("hang-2", "hang_async", at=1, outcome=None, pid=KILLED_PID)
    b.run("hang-2", "hang_async", at=6, outcome="cancelled", error_class="CancelledError", took=2)
    b.dies("hang-2", "retries_exhausted", "JobTimeout", "soak-c")
    b.process_died(KILLED_PID, 1.5, killed=True)
    assert b.judge().rows["hang_async"].lost_runs == 1
    b.process_died(KILLED_PID, 30, killed=True)
    assert b.judge().rows["hang_async"].lost_runs == 0


def test_a_hanging_run_whose_process_a_crash_job_ended_before_the_timeout_is_lost():
    """The watcher notes a death up to a poll late; the crash job's start in that process is when it died."""
    b = Book()
    b.enqueue("hang-3", "hang_sync")
    b.run("hang-3", "hang_sync", at=1, outcome=None, pid=KILLED_PID)
    b.enqueue("crash-3", "crash")
    b.run("crash-3", "crash", at=2.9, outcome=None, pid=KILLED_PID)
    b.process_died(KILLED_PID, 3.1)  # noticed after the hang's timeout (1 + 2 s), though it died before it
    assert b.judge().rows["hang_sync"].lost_runs == 1


def test_a_job_that_must_die_but_succeeded_is_flagged():
    b = a_clean_book()
    b.enqueue("fail-2", "always_fail")
    b.run("fail-2", "always_fail", at=1)
    assert what(b.judge()) == [("unexpected success", "fail-2")]


def test_runs_and_dead_jobs_the_producer_never_enqueued_are_flagged():
    b = a_clean_book()
    b.run("stray-1", "ok", at=1)
    b.dies("stray-2", "retries_exhausted")
    assert what(b.judge()) == [("never enqueued", "stray-1"), ("never enqueued", "stray-2")]


def test_a_dead_job_the_ledger_never_saw_run_is_flagged():
    b = a_clean_book()
    b.enqueue("fail-2", "always_fail")
    b.dies("fail-2", "retries_exhausted")
    assert what(b.judge()) == [("dead without a run", "fail-2")]


def test_stored_results_must_agree_with_the_ledger():
    b = a_clean_book()
    b.results = {"ok-1": "SUCCESSFUL", "fail-1": "FAILED", "once-1": "READY", "hang-1": "FAILED",
                 "crash-1": "READY", "schedule:soak-tick:1795000000000": "SUCCESSFUL"}
    verdict = b.judge()
    assert what(verdict) == [("result", "crash-1"), ("result", "once-1")], "a dead job is FAILED, a panic too"
    assert "get_result() says READY" in verdict.discrepancies[0].detail
    b.results["crash-1"] = b.results["once-1"] = None
    assert what(b.judge()) == [("result", "crash-1"), ("result", "once-1")], "no result at all is flagged too"


def test_leftovers_torn_lines_and_missing_fires_are_problems():
    b = a_clean_book()
    b.leftovers = {"soak-a": {"stream": 0, "delayed": 2, "pending": 0}, "soak-b": {"stream": 0, "delayed": 0,
                                                                                 "pending": 0}}
    b.fires = {"soak-tick": 3}
    b.lines.append('{"j": "ok-9", "k": "ok", "e": "sta')
    verdict = b.judge()
    assert not verdict.ok and not verdict.discrepancies
    text = "\n".join(verdict.problems)
    assert "queue soak-a not drained: delayed 2" in text
    assert "soak-b" not in text
    assert "recorded 3 fire(s)" in text and "account for 1 fire(s)" in text
    assert "not a whole record" in text


def test_a_fire_counted_missed_may_have_its_job_but_no_due_time_has_one_unplanned():
    """A leader that added a due time's job and was killed before recording the fire leaves the due time to the
    next leader; past its grace, the misfire policy counts it missed. Its job is no discrepancy; a job beyond the
    fires and the misses recorded is one, and so is a recorded fire without its job."""
    b = a_clean_book()  # one fire of soak-tick, with its job
    b.run("schedule:soak-tick:1795000005000", "scheduled", at=8)
    assert any("account for 2 fire(s)" in p for p in b.judge().problems), "one job more than the fires recorded"
    b.missed = {"soak-tick": 1}
    assert b.judge().ok, "the extra job is the one of the due time counted missed"
    b.fires = {"soak-tick": 3}
    assert any("recorded 3 fire(s)" in p for p in b.judge().problems), "a recorded fire without its job"


def test_the_report_shows_the_first_offenders_of_each_kind_and_counts_the_rest():
    b = a_clean_book()
    for i in range(5):
        b.enqueue(f"lost-{i}", "ok")
    text = report_discrepancies(b.judge(), per_kind=2)
    assert text.count("UNACCOUNTED: job lost-") == 2
    assert "... and 3 more unaccounted" in text


@pytest.mark.parametrize("kind", [k for k in KINDS if k.expect == "dead"])
def test_every_kind_that_must_die_names_its_reason(kind):
    assert kind.reason in ("retries_exhausted", "unrecoverable", "panic")


def test_the_writer_appends_whole_lines_that_the_reader_reads_back(tmp_path):
    path = str(tmp_path / "ledger.jsonl")
    writer = LedgerWriter(path)
    writer.write(j="ok-1", k="ok", e="enqueue")
    writer.write(j="ok-1", k="ok", e="start", r="x", a=1)
    writer.write(j="ok-1", k="ok", e="end", r="x", o="ok")
    writer.close()
    ledger = read([path, str(tmp_path / "missing.jsonl")])
    assert ledger.enqueued == {"ok-1": "ok"}
    (run,) = ledger.runs["ok-1"]
    assert (run.attempt, run.outcome, run.ended is not None) == (1, "ok", True)
    assert BY_NAME["ok"].budget == 3


def test_runs_of_a_limited_kind_past_its_concurrency_are_a_problem_and_at_the_limit_are_not():
    limit = BY_NAME["limited"].concurrency
    book = Book()
    for n in range(limit):  # side by side: exactly at the limit
        book.run(book.enqueue(f"soak-limited-{n}", "limited"), "limited", at=1.0, took=0.5)
    book.run(book.enqueue("soak-limited-next", "limited"), "limited", at=1.5, took=0.5)  # starts as they end
    assert book.judge().problems == []
    book.run(book.enqueue("soak-limited-extra", "limited"), "limited", at=1.2, took=0.1)
    assert book.judge().problems == [f"limited: {limit + 1} runs were under way at once; its concurrency limit "
                                     f"is {limit}"]



def test_runs_of_a_limited_kind_past_its_rate_are_a_problem_and_at_the_rate_are_not():
    rate = BY_NAME["limited"].rate
    book = Book()
    for n in range(rate):  # a whole second's worth, spread over most of it
        book.run(book.enqueue(f"soak-limited-{n}", "limited"), "limited", at=1.0 + n * 0.02, took=0.001)
    book.run(book.enqueue("soak-limited-next", "limited"), "limited", at=2.0, took=0.001)  # a second after the first
    assert book.judge().problems == []
    book.run(book.enqueue("soak-limited-extra", "limited"), "limited", at=1.5, took=0.001)
    assert book.judge().problems == [f"limited: {rate + 1} runs started within one second; its rate limit is "
                                     f"{rate} a second"]

# --- the rules that excuse nothing without evidence -------------------------------------------------------------
