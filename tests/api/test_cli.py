"""``manage.py chasqui``: inspect, dlq, delayed, pause/resume/purge, workers/quiet/stop, apikey, operations."""

import io
import os
import signal
from datetime import datetime, timedelta, UTC

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from chasqui_core.engine.ops import control
from chasqui_core.engine.store.keys import QueueKeys
from chasqui_core.engine.producer.queue import Queue
from chasqui_core.management.terminal import ProgressBar, parse_when
from chasqui_core.models import ApiKey, AuditEntry

from tests.helpers import TASK, add_dead, bulk_dead

from .helpers import ApiClient, add_delayed, dlq_len, heartbeat, stream_jobs

pytestmark = pytest.mark.django_db

Q = "default"


def run(*args) -> str:
    out = io.StringIO()
    call_command("chasqui", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_inspect_all_and_one(redis):
    Queue(Q, redis_client=redis).add(TASK, [1, 2])
    bulk_dead(redis, Q, 3, message="user {i} missing")
    heartbeat(redis, [Q], "w-1", in_flight=1)
    out = run("inspect")
    header, rule, *rows = out.splitlines()
    assert header.split()[:3] == ["QUEUE", "STATE", "STREAM"]
    by_name = {r.split()[0]: r.split() for r in rows}
    assert set(by_name) == {"default", "emails"}
    assert by_name["default"][1:3] == ["active", "1"]
    one = run("inspect", Q)
    assert "w-1" in one and "box-1" in one
    assert "user <n> missing" in one and " 3 " in one


def test_inspect_unknown_queue():
    with pytest.raises(CommandError, match="No queue named 'ghost'"):
        run("inspect", "ghost")


def test_dlq_peek_with_filters(redis):
    add_dead(redis, Q, task="a.task", messages=("boom a",))
    add_dead(redis, Q, task="b.task", messages=("boom b",), kwargs={"password": "hunter2"})
    out = run("dlq", "peek", Q)
    assert "a.task" in out and "b.task" in out and "2 shown of 2" in out
    only_b = run("dlq", "peek", Q, "--task", "b.task")
    assert "b.task" in only_b and "a.task" not in only_b
    assert "a.task" in run("dlq", "peek", Q, "--error-text", "BOOM A")
    assert "0 shown" in run("dlq", "peek", Q, "--since", "2000-01-01", "--until", "2000-01-02")
    assert "2 shown" in run("dlq", "peek", Q, "--since", "1h")
    entry = run("dlq", "peek", Q, "--limit", "1").splitlines()[2].split()[0]
    full = run("dlq", "peek", Q, "--entry", entry)
    assert "Traceback" in full and "hunter2" not in full
    with pytest.raises(CommandError, match="limit"):
        run("dlq", "peek", Q, "--limit", "0")
    with pytest.raises(CommandError, match="not a time"):
        run("dlq", "peek", Q, "--since", "last tuesday")


def test_dlq_replay_by_filter_and_ids_is_audited_as_cli(redis):
    ids = bulk_dead(redis, Q, 5, task="a.task")
    bulk_dead(redis, Q, 3, task="b.task")
    out = run("dlq", "replay", Q, "--task", "b.task", "--yes")
    assert "Replayed 3 entries" in out
    assert sorted({j.task for j in stream_jobs(redis, Q)}) == ["b.task"]
    out = run("dlq", "replay", Q, "--ids", ids[0], ids[1], "--yes", "--one-more-attempt")
    assert "Replayed 2 of 2" in out
    assert dlq_len(redis, Q) == 3
    entries = list(AuditEntry.objects.order_by("id"))
    assert [(e.action, e.count, e.source, e.actor_repr, e.actor_id) for e in entries] == [
        ("replay", 3, "cli", "cli", None), ("replay", 2, "cli", "cli", None)]
    assert entries[0].filter == {"task": "b.task"}
    assert entries[1].detail["reset_attempts"] is False


def test_dlq_discard_with_filters(redis):
    bulk_dead(redis, Q, 4, cls="TimeoutError")
    bulk_dead(redis, Q, 2, cls="ValueError")
    assert "Discarded 4 entries" in run("dlq", "discard", Q, "--error-class", "TimeoutError", "--yes")
    assert dlq_len(redis, Q) == 2
    assert "Discarded 2 entries" in run("dlq", "discard", Q, "--all", "--yes")
    assert dlq_len(redis, Q) == 0
    assert [e.count for e in AuditEntry.objects.order_by("id")] == [4, 2]


def test_dlq_groups_print_fingerprints_that_select_one_group(redis):
    from chasqui_core.engine.dlq.fingerprint import fingerprint

    bulk_dead(redis, Q, 3, cls="TimeoutError", message="gateway timed out after {i} s")
    bulk_dead(redis, Q, 2, cls="ValueError")
    group = fingerprint("TimeoutError", "gateway timed out after 1 s")
    assert group in run("dlq", "groups", Q)
    assert "Discarded 3 entries" in run("dlq", "discard", Q, "--fingerprint", group, "--yes")
    assert dlq_len(redis, Q) == 2


def test_dlq_reindex_builds_the_index_of_entries_written_without_it(redis):
    from chasqui_core.engine.dlq.index import DLQIndex

    bulk_dead(redis, Q, 1500, cls="TimeoutError", message="gateway timed out after {i} s")  # plain XADDs
    assert not DLQIndex(redis, Q).state().ready
    out = run("dlq", "reindex", Q)
    assert "Indexing: 1,500/1,500" in out and "ready: 1,500 entries" in out
    state = DLQIndex(redis, Q).state()
    assert state.ready and state.indexed == 1500
    assert AuditEntry.objects.count() == 0, "building an index changes no job: nothing to audit"


def test_dlq_actions_need_a_selection_and_a_confirmation(redis):
    bulk_dead(redis, Q, 2)
    with pytest.raises(CommandError, match="Nothing selected"):
        run("dlq", "replay", Q)
    with pytest.raises(CommandError, match="--yes"):
        run("dlq", "discard", Q, "--all")  # no terminal to ask on
    with pytest.raises(CommandError, match="either --ids or filters"):
        run("dlq", "discard", Q, "--ids", "1-0", "--task", "x", "--yes")
    assert dlq_len(redis, Q) == 2
    assert not AuditEntry.objects.exists()


def test_actor_is_the_first_superuser_or_as_user(redis, operator, viewer):
    root = User.objects.create_superuser("root", password="pw")
    bulk_dead(redis, Q, 2)
    run("pause", Q)
    assert AuditEntry.objects.get().actor == root
    run("--as", operator.username, "resume", Q)
    assert AuditEntry.objects.latest("id").actor == operator
    with pytest.raises(CommandError, match="replay_jobs"):
        run("--as", viewer.username, "dlq", "replay", Q, "--all", "--yes")
    assert dlq_len(redis, Q) == 2
    with pytest.raises(CommandError, match="no user named"):
        run("--as", "ghost", "pause", Q)


def test_pause_and_resume(redis):
    assert "Paused default" in run("pause", Q)
    assert redis.exists(QueueKeys.for_queue(Q).paused)
    assert "already paused" in run("pause", Q)
    assert "paused" in run("inspect").splitlines()[2]
    assert "Resumed default" in run("resume", Q)
    assert not redis.exists(QueueKeys.for_queue(Q).paused)
    assert [e.action for e in AuditEntry.objects.order_by("id")] == ["pause", "pause", "resume"]


def test_delayed_list_cancel_run(redis):
    a = add_delayed(redis, Q)
    b = add_delayed(redis, Q, delay_ms=7_200_000)
    out = run("delayed", "list", Q)
    assert a in out and b in out
    assert "Cancelled" in run("delayed", "cancel", Q, a)
    assert "moved to the stream" in run("delayed", "run", Q, b)
    assert [j.id for j in stream_jobs(redis, Q)] == [b]
    with pytest.raises(CommandError, match="No delayed job"):
        run("delayed", "cancel", Q, a)
    assert [e.action for e in AuditEntry.objects.order_by("id")] == ["cancel_delayed", "run_delayed_now"]


def test_apikey_create_prints_it_once_and_revoke_works(operator, redis):
    out = run("apikey", "create", "--user", operator.username, "--name", "ci")
    key = out.strip().splitlines()[-1]
    row = ApiKey.objects.get()
    assert (row.user, row.name, row.prefix) == (operator, "ci", key[:8])
    assert key not in row.key_hash
    assert ApiClient(key).get("/api/queues").status_code == 200
    listed = run("apikey", "list")
    assert row.prefix in listed and key not in listed
    assert "Revoked" in run("apikey", "revoke", row.prefix)
    assert ApiClient(key).get("/api/queues").status_code == 401
    with pytest.raises(CommandError, match="No active API key"):
        run("apikey", "revoke", row.prefix)
    with pytest.raises(CommandError, match="No user named"):
        run("apikey", "create", "--user", "ghost")
    assert [e.action for e in AuditEntry.objects.order_by("id")] == ["apikey_create", "apikey_revoke"]


def test_an_issued_key_never_starts_with_a_dash(operator, monkeypatch):
    # One key in 64 from token_urlsafe starts with "-", and `chasqui apikey revoke -Xy...` would read it as an option.
    drawn = iter(["-leading-dash-key-0123456789abcdefghijklmnopq", "A-key-the-cli-can-take-0123456789abcdefghijk"])
    monkeypatch.setattr("chasqui_core.models.secrets.token_urlsafe", lambda n: next(drawn))
    row, key = ApiKey.issue(operator)
    assert key.startswith("A-key") and row.prefix == key[:8]
    assert "Revoked" in run("apikey", "revoke", row.prefix)


def test_operations_lists_background_work(operator, redis):
    from chasqui_core.models import Operation

    Operation.objects.create(kind="replay", queue=Q, status="done", done=9, total=9, count=9, created_by=operator)
    out = run("operations")
    assert "replay" in out and "9/9" in out and "olga" in out


def test_interrupted_sweep_stops_between_chunks(redis, monkeypatch):
    """A real SIGINT (Ctrl-C) sets the stop flag; the sweep ends after the chunk in progress."""
    from chasqui_core.management.commands import chasqui as cli

    bulk_dead(redis, Q, 2_000)

    class PressedDuringFirstChunk(cli.Interrupt):
        asked = 0

        def __call__(self):  # asked before each chunk
            type(self).asked += 1
            if type(self).asked == 2:
                os.kill(os.getpid(), signal.SIGINT)  # handled by Interrupt, in this (main) thread
            return super().__call__()

    monkeypatch.setattr(cli, "Interrupt", PressedDuringFirstChunk)
    out = run("dlq", "replay", Q, "--all", "--yes")
    assert "Stopping after the current chunk" in out
    assert "Stopped: replayed 500 entries (500 of 2,000 handled)" in out
    assert len(stream_jobs(redis, Q)) == 500 and dlq_len(redis, Q) == 1_500
    audit = AuditEntry.objects.get()
    assert audit.count == 500 and audit.detail["interrupted"] is True


def test_progress_bar_on_a_terminal_and_in_logs():
    tty = io.StringIO()
    bar = ProgressBar(tty, "Replay", tty=True)
    bar(0, 200)
    bar(100, 200)
    bar(200, 200)
    bar.close()
    assert "\rReplay [###############...............] 100/200  50%" in tty.getvalue()
    assert tty.getvalue().endswith("200/200 100%\n")
    log = io.StringIO()
    bar = ProgressBar(log, "Replay", tty=False, every=3600)
    for done in range(0, 1001, 100):
        bar(done, 1000)
    assert log.getvalue().splitlines() == ["Replay: 0/1,000", "Replay: 1,000/1,000"]


def test_parse_when():
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert parse_when("30m", now=now) == now - timedelta(minutes=30)
    assert parse_when("2d", now=now) == now - timedelta(days=2)
    assert parse_when("2026-01-01T10:00:00") == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert parse_when("2026-01-01T10:00:00+02:00").utcoffset() == timedelta(hours=2)


def test_cancel_a_waiting_job_by_id(redis):
    job = Queue(Q, redis_client=redis).add("tests.django.sample_tasks.add", [1, 2])
    assert "it will not run" in run("cancel", job.job_id)
    assert redis.hexists(QueueKeys.for_queue(Q).cancel, job.job_id)
    with pytest.raises(CommandError, match="No job"):
        run("cancel", "no-such-job")
    assert [e.action for e in AuditEntry.objects.order_by("id")] == ["cancel_job"]


def test_purge_asks_first_then_deletes_every_band_and_is_audited(redis):
    queue = Queue(Q, redis_client=redis)
    queue.add(TASK, [1])
    queue.add(TASK, [2], priority=5)
    queue.add(TASK, [3], delay=600)
    with pytest.raises(CommandError, match=r"Delete about 2 waiting jobs of default \(1 high, 1 default\)\? .*--yes"):
        run("purge", Q)  # no terminal to ask on
    assert "Purged 2 waiting jobs of default" in run("purge", Q, "--yes")
    assert stream_jobs(redis, Q) == []
    assert redis.zcard(QueueKeys.for_queue(Q).delayed) == 1
    assert "no waiting jobs" in run("purge", Q, "--yes")
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.source, entry.count) == ("purge", "cli", 2)


def test_workers_quiet_and_stop_by_id(redis, operator, viewer):
    heartbeat(redis, [Q, "emails"], "w-1", in_flight=2)
    heartbeat(redis, [Q], "w-old", age_ms=3_600_000)
    rows = {line.split()[0]: line.split() for line in run("workers").splitlines()[2:]}
    assert rows["w-1"][4] == "default,emails" and rows["w-1"][-1] == "running"
    assert rows["w-old"][-1] == "stale"
    assert "Sent quiet to worker w-1" in run("--as", operator.username, "quiet", "w-1")
    assert control.pending(redis, "w-1") == "quiet"
    assert "had been asked already" in run("quiet", "w-1")
    assert "Sent stop to worker w-1" in run("stop", "w-1")
    assert control.pending(redis, "w-1") == "stop"
    with pytest.raises(CommandError, match="has not sent a heartbeat lately"):
        run("stop", "w-old")
    with pytest.raises(CommandError, match="No worker 'ghost'"):
        run("quiet", "ghost")
    with pytest.raises(CommandError, match="pause_queues"):
        run("--as", viewer.username, "stop", "w-1")
    assert [(e.action, e.actor) for e in AuditEntry.objects.order_by("id")] == [
        ("worker_quiet", operator), ("worker_quiet", None), ("worker_stop", None)]
