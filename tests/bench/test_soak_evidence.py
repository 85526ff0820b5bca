"""The soak's accounting excuses nothing without evidence (bench/soak/verdict.py and run_rules.py).

A rerun, an overlap, a charged attempt or a panic passes only where the made-up deaths, clean stops and
cut-offs (tests/bench/soak_book.py) explain it; no server is needed.
"""

from __future__ import annotations

from bench.soak.kinds import KINDS
from bench.soak.ledger import parse
from bench.soak.verdict import Evidence, judge
from bench.soak.verdict_report import report_discrepancies
from tests.bench.soak_book import ALIVE_PID, CRASHED_PID, GRACEFUL_PID, KILLED_PID, Book, a_clean_book, what


def test_a_job_that_succeeded_again_with_no_fault_in_between_is_flagged_though_within_its_budget():
    b = a_clean_book()
    b.enqueue("ok-2", "ok")
    for at in (1, 2, 3):
        b.run("ok-2", "ok", at=at)
    verdict = b.judge()
    assert what(verdict) == [("ran after success", "ok-2"), ("ran after success", "ok-2")]
    assert verdict.rows["ok"].max_runs == 3, "three runs are within its budget: the budget alone cannot see it"


def test_a_success_may_run_again_only_after_its_process_died_or_lost_contact_before_the_next_run():
    b = a_clean_book()
    b.enqueue("ok-2", "ok")
    b.run("ok-2", "ok", at=1, pid=KILLED_PID)
    b.process_died(KILLED_PID, 1.2, killed=True)  # after the run ended, before the outcome was settled
    b.run("ok-2", "ok", at=8, attempt=1)
    b.run("ok-2", "ok", at=20, attempt=1)
    assert what(b.judge()) == [("ran after success", "ok-2")], "the first rerun has its evidence, the second none"
    b.cut(8.5, 19)  # the workers were cut off from Redis after the second run ended: its outcome was lost too
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    assert verdict.rows["ok"].unsettled == 2


def test_a_death_long_after_the_rerun_is_no_evidence_for_it():
    b = a_clean_book()
    b.enqueue("ok-2", "ok")
    b.run("ok-2", "ok", at=1, pid=KILLED_PID)
    b.run("ok-2", "ok", at=3, attempt=1)
    b.process_died(KILLED_PID, 30, killed=True)
    assert what(b.judge()) == [("ran after success", "ok-2")]


def test_a_failed_run_repeated_as_the_same_attempt_needs_a_lost_outcome():
    b = a_clean_book()
    b.enqueue("once-2", "fail_once")
    b.run("once-2", "fail_once", at=1, outcome="error", error_class="SoakFailure", attempt=1)
    b.run("once-2", "fail_once", at=2, outcome="error", error_class="SoakFailure", attempt=1)
    b.run("once-2", "fail_once", at=3, attempt=2)
    assert what(b.judge()) == [("rerun without a lost outcome", "once-2")], "within its budget of 3 runs"


def test_two_runs_of_one_job_at_the_same_time_in_live_processes_are_flagged():
    b = a_clean_book()
    b.enqueue("slow-1", "slow_sync")
    b.run("slow-1", "slow_sync", at=1, took=3, outcome="error", error_class="SoakFailure", pid=ALIVE_PID)
    b.run("slow-1", "slow_sync", at=2, took=3, outcome="error", error_class="SoakFailure", pid=ALIVE_PID + 1)
    b.run("slow-1", "slow_sync", at=3, took=3, pid=ALIVE_PID)
    verdict = b.judge()
    assert what(verdict) == [("ran twice at once", "slow-1")], "one line per job, however many overlaps"
    assert "while run r" in verdict.discrepancies[0].detail
    b.cut(0.5, 2.5)  # its process was cut off from Redis while it ran: its entry went to another worker
    assert b.judge().ok, report_discrepancies(b.judge())


def test_a_run_ended_by_its_process_s_death_does_not_overlap_the_run_after_it():
    b = a_clean_book()
    b.enqueue("crash-2", "crash")
    b.run("crash-2", "crash", at=1, outcome=None, pid=CRASHED_PID + 5)
    b.process_died(CRASHED_PID + 5, 1.5)
    b.run("crash-2", "crash", at=1.4, outcome=None, pid=CRASHED_PID + 6)
    b.process_died(CRASHED_PID + 6, 1.6)
    b.dies("crash-2", "panic", "WorkerLost", "soak-c")
    verdict = b.judge()
    assert verdict.ok, "the crash job's start is when its process died, though the watcher saw it later"


def test_an_attempt_charged_without_a_run_is_flagged():
    b = Book()  # no process dies in this book: nothing could have charged an attempt without its run
    b.enqueue("fail-2", "always_fail")
    b.run("fail-2", "always_fail", at=1, outcome="error", error_class="SoakFailure")
    b.run("fail-2", "always_fail", at=2, outcome="error", error_class="SoakFailure")
    b.dies("fail-2", "retries_exhausted", at=5)
    verdict = b.judge()
    assert what(verdict) == [("attempt without a run", "fail-2")], "dead after 2 of its 3 runs"
    assert "attempt(s) 3 were charged" in verdict.discrepancies[0].detail
    b.enqueue("once-2", "fail_once")
    b.run("once-2", "fail_once", at=1, outcome="error", error_class="SoakFailure", attempt=1)
    b.run("once-2", "fail_once", at=2, attempt=3)
    assert ("attempt without a run", "once-2") in what(b.judge()), "a gap in the attempts is a charge without a run"


def test_an_attempt_charged_without_a_run_while_a_process_died_is_named_for_it():
    """The engine marks a run started a moment before the task's first line: a death in between charges it."""
    b = Book()
    b.enqueue("once-2", "fail_once")
    b.run("once-2", "fail_once", at=5, attempt=2)
    b.process_died(KILLED_PID, 8, killed=True)  # after the run it could have been: no excuse
    assert what(b.judge()) == [("attempt without a run", "once-2")]
    b.process_died(KILLED_PID, 3, killed=True)
    verdict = b.judge()
    assert what(verdict) == [] and verdict.ok, "a death while it was due is the evidence: noted, not failed"
    assert [(n.what, n.job_id) for n in verdict.notes] == [("charged before its first line", "once-2")]
    assert "attempt(s) 1 were charged" in verdict.notes[0].detail


def test_a_process_that_stopped_cleanly_is_not_dead():
    b = a_clean_book()
    b.enqueue("ok-2", "ok")
    b.run("ok-2", "ok", at=1, outcome=None, pid=GRACEFUL_PID)
    b.run("ok-2", "ok", at=8)
    b.exited(GRACEFUL_PID, 2)
    verdict = b.judge()
    assert what(verdict) == [("no end in a clean stop", "ok-2")]
    assert verdict.rows["ok"].lost_runs == 0, "not a run lost with its process"
    b.lines = [line for line in b.lines if '"exit"' not in line]  # no clean stop on record: it died under the run
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    assert verdict.rows["ok"].lost_runs == 1


def test_a_panic_from_runs_in_processes_that_stopped_cleanly_is_false():
    b = a_clean_book()
    b.enqueue("crash-2", "crash")
    b.run("crash-2", "crash", at=1, outcome=None, pid=GRACEFUL_PID)
    b.run("crash-2", "crash", at=8, outcome=None, pid=GRACEFUL_PID + 1)
    b.exited(GRACEFUL_PID, 1.5)
    b.exited(GRACEFUL_PID + 1, 8.5)
    b.dies("crash-2", "panic", "WorkerLost", "soak-c")
    assert ("false panic", "crash-2") in what(b.judge())


def test_runs_that_returned_before_their_process_died_are_never_deaths_and_a_panic_from_them_is_named():
    """The engine today charges a run that returned just before its process was killed: named for what it is."""
    b = a_clean_book()
    b.enqueue("ok-2", "ok")
    b.run("ok-2", "ok", at=1, pid=KILLED_PID)
    b.process_died(KILLED_PID, 1.15, killed=True)
    b.run("ok-2", "ok", at=8, pid=KILLED_PID + 1, attempt=2)
    b.process_died(KILLED_PID + 1, 8.15, killed=True)
    b.dies("ok-2", "panic", "WorkerLost", "soak-a", at=15)
    verdict = b.judge()
    assert ("finished run charged", "ok-2") in what(verdict)
    assert "false panic" not in verdict.counts()
    assert verdict.rows["ok"].lost_runs == 0, "a run that returned is not lost, however soon its process died"


def test_a_worker_lost_charge_for_a_run_that_returned_is_named_and_one_with_no_evidence_is_false():
    b = a_clean_book()
    b.enqueue("fail-2", "always_fail")
    b.run("fail-2", "always_fail", at=1, outcome="error", error_class="SoakFailure")
    b.run("fail-2", "always_fail", at=2, outcome="error", error_class="SoakFailure")
    b.run("fail-2", "always_fail", at=3, outcome="error", error_class="SoakFailure", pid=KILLED_PID)
    b.process_died(KILLED_PID, 3.2, killed=True)
    b.dies("fail-2", "retries_exhausted", "WorkerLost", at=10)
    assert what(b.judge()) == [("finished run charged", "fail-2")]
    b.process_died(KILLED_PID, 12, killed=True)  # it died after the job was dead-lettered: no evidence at all
    assert what(b.judge()) == [("false worker lost", "fail-2")]


def test_lost_contact_charged_as_a_death_is_named_and_never_a_death():
    b = a_clean_book()
    b.enqueue("ok-2", "ok")
    b.run("ok-2", "ok", at=1, pid=ALIVE_PID)
    b.run("ok-2", "ok", at=8, pid=ALIVE_PID + 1, attempt=2)
    b.cut(0.5, 7)
    b.cut(8.5, 14)
    b.dies("ok-2", "panic", "WorkerLost", "soak-a", at=15)
    verdict = b.judge()
    # both successes were lost with the contact (so "succeeded and dead" is no discrepancy of its own); the panic,
    # charged for lost contact, is
    assert what(verdict) == [("lost contact charged", "ok-2")]
    assert verdict.rows["ok"].lost_runs == 0 and verdict.rows["ok"].unsettled == 1


def test_a_retry_after_a_failed_run_needs_no_evidence_and_earns_no_extra_run():
    """A process that died between a failed run and its retry lost nothing: the retry was due anyway."""
    b = a_clean_book()
    b.enqueue("fail-2", "always_fail")
    b.run("fail-2", "always_fail", at=1, outcome="error", error_class="SoakFailure", pid=KILLED_PID)
    b.process_died(KILLED_PID, 1.2, killed=True)
    b.run("fail-2", "always_fail", at=2, outcome="error", error_class="SoakFailure")
    b.run("fail-2", "always_fail", at=3, outcome="error", error_class="SoakFailure")
    b.dies("fail-2", "retries_exhausted")
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    assert verdict.rows["always_fail"].unsettled == 0
    b.run("fail-2", "always_fail", at=4, outcome="error", error_class="SoakFailure")
    assert what(b.judge()) == [("over budget", "fail-2")]


def test_a_process_a_crash_job_ended_died_no_sooner_than_the_last_line_it_wrote():
    """os._exit runs in the crash job's thread: the event loop may finish and write other runs first."""
    b = a_clean_book()
    b.enqueue("crash-2", "crash")
    b.run("crash-2", "crash", at=10, outcome=None, pid=KILLED_PID)
    b.run("crash-2", "crash", at=20, outcome=None, pid=KILLED_PID + 1)
    b.process_died(KILLED_PID, 10.2)
    b.process_died(KILLED_PID + 1, 20.2)
    b.dies("crash-2", "panic", "WorkerLost", "soak-c", at=30)
    b.enqueue("ok-2", "ok")
    b.run("ok-2", "ok", at=9.99, took=0.02, pid=KILLED_PID)  # ended 10 ms after the crash job started
    b.run("ok-2", "ok", at=16, attempt=2)
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    assert verdict.rows["ok"].unsettled == 1


def test_the_evidence_kept_with_a_run_is_judged_again_the_same(tmp_path):
    from bench.soak.record import load, save
    from bench.soak.run import main

    b = a_clean_book()
    b.enqueue("ok-2", "ok")
    for at in (1, 2):
        b.run("ok-2", "ok", at=at)
    b.cut(1.5, 1.8)  # a lost contact: it excuses the second run
    b.killed.add(CRASHED_PID)
    (tmp_path / "ledger.jsonl").write_text("\n".join(b.lines) + "\n")
    save(str(tmp_path), Evidence(parse(b.lines), {k.name: k for k in KINDS}, b.dead, b.dead_pids, b.killed,
                                 None, b.leftovers, b.fires, b.cut_off))
    kept = load(str(tmp_path))
    assert (kept.cut_off, kept.killed, kept.dead, kept.results) == (b.cut_off, b.killed, b.dead, None)
    assert kept.dead_pids == b.dead_pids
    assert judge(kept).ok and main(["--judge", str(tmp_path)]) == 0
    b.cut_off.clear()
    (tmp_path / "ledger.jsonl").write_text("\n".join(b.lines) + "\n")
    save(str(tmp_path), Evidence(parse(b.lines), {k.name: k for k in KINDS}, b.dead, b.dead_pids, b.killed))
    assert what(judge(load(str(tmp_path)))) == [("ran after success", "ok-2")]
    assert main(["--judge", str(tmp_path)]) == 1
    assert main(["--judge", str(tmp_path / "nothing-here")]) == 2


def test_a_job_whose_success_was_lost_with_its_process_may_end_dead_but_one_with_a_settled_success_may_not():
    """A slow job died with a crash, ran again and succeeded, and its process died before the settle: Redis never
    heard of the success. It ran a third time, alone, and its process was killed again: two deaths, a panic by
    the rules. Only the lost success excuses the success beside the dead-letter entry."""
    b = a_clean_book()
    b.enqueue("slow-9", "slow_sync")
    b.run("slow-9", "slow_sync", at=1, outcome=None, pid=KILLED_PID)
    b.process_died(KILLED_PID, 1.5, killed=True)
    b.run("slow-9", "slow_sync", at=3, pid=CRASHED_PID + 7, attempt=2)
    b.process_died(CRASHED_PID + 7, 3.5)
    b.run("slow-9", "slow_sync", at=8, outcome=None, pid=KILLED_PID + 1, attempt=2)
    b.process_died(KILLED_PID + 1, 8.5, killed=True)
    b.dies("slow-9", "panic", "WorkerLost", at=9)
    verdict = b.judge()
    assert "succeeded and dead" not in [w for w, _ in what(verdict)], report_discrepancies(verdict)
    b.process_died(CRASHED_PID + 7, None)
    b.dead_pids.pop(CRASHED_PID + 7)  # its process lived: the success was settled, and the job is still dead
    assert ("succeeded and dead", "slow-9") in what(b.judge())


def test_a_hanging_run_ended_by_its_timeout_may_run_again_only_after_that_outcome_was_lost():
    """A hanging sync run has no end line: its timeout ends it, and its worker writes the JobTimeout outcome then.
    When its process dies after the timeout and before the settle, the job runs again as the same attempt: one more
    run, explained. Without such a death, the same rerun is flagged."""
    b = a_clean_book()
    b.enqueue("hang-9", "hang_sync")
    b.run("hang-9", "hang_sync", at=1, outcome=None)
    b.run("hang-9", "hang_sync", at=4, outcome=None, pid=CRASHED_PID + 8, attempt=2)
    b.process_died(CRASHED_PID + 8, 7)  # after its timeout (4 + 2 s): the run had ended, its outcome unsettled
    b.run("hang-9", "hang_sync", at=9, outcome=None, attempt=2)
    b.dies("hang-9", "retries_exhausted", "chasqui_core.engine.jobs.errors.JobTimeout", at=12)
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    assert verdict.rows["hang_sync"].unsettled == 1
    b.dead_pids.pop(CRASHED_PID + 8)
    flagged = [w for w, j in what(b.judge()) if j == "hang-9"]
    assert "rerun without a lost outcome" in flagged


def test_a_hanging_run_whose_process_died_just_after_its_timeout_may_be_charged_as_lost():
    """The worker sees a sync run's timeout on its event loop, every 0.2 s, later on a loaded host: a process that
    died 0.9 s after the timeout may have died before the worker ended the run, and charging it a death is right.
    Two seconds after, the run had ended: a death charged for it is a finished run charged."""
    b = a_clean_book()
    b.enqueue("hang-8", "hang_sync")
    b.run("hang-8", "hang_sync", at=1, outcome=None)
    b.run("hang-8", "hang_sync", at=4, outcome=None, pid=CRASHED_PID + 9, attempt=2)
    b.process_died(CRASHED_PID + 9, 6.9)  # 0.9 s after its timeout
    b.dies("hang-8", "retries_exhausted", "WorkerLost", at=12)
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    b.process_died(CRASHED_PID + 9, 8.5)
    assert ("finished run charged", "hang-8") in what(b.judge())


def test_a_budget_spent_by_an_attempt_lost_before_its_first_line_is_no_finished_run_charged():
    """The last attempt was marked started and its process died before the task's first line (noted, with the
    death as evidence): its WorkerLost is that attempt's, not the earlier run's, whose outcome was lost too."""
    b = a_clean_book()
    b.enqueue("fail-8", "always_fail")
    b.run("fail-8", "always_fail", at=1, outcome="error", error_class="SoakFailure", pid=CRASHED_PID + 10)
    b.run("fail-8", "always_fail", at=2, outcome="error", error_class="SoakFailure", pid=CRASHED_PID + 10)
    b.process_died(CRASHED_PID + 10, 2.5)  # after run 2 ended: its outcome (a retry) may be lost too
    b.process_died(CRASHED_PID + 11, 5)  # while attempt 3 was due: marked started, died before its first line
    b.dies("fail-8", "retries_exhausted", "WorkerLost", at=10)
    verdict = b.judge()
    assert verdict.ok, report_discrepancies(verdict)
    assert [n.what for n in verdict.notes if n.job_id == "fail-8"] == ["charged before its first line"]
