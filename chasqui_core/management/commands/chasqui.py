"""``manage.py chasqui``: the operator's tools from a shell.

    chasqui inspect [QUEUE]
    chasqui dlq peek|groups|replay|discard QUEUE [filters] [--ids ...] [--all] [--yes]
    chasqui delayed list|cancel|run QUEUE [JOB_ID]
    chasqui pause|resume|purge QUEUE
    chasqui workers [QUEUE] | quiet|stop WORKER_ID
    chasqui apikey create --user NAME [--name TEXT] | revoke PREFIX | list
    chasqui operations [--run [QUEUE]]

Every change goes through the same service layer as the API and is audited
with source "cli", acting as ``--as USER`` (default: the first superuser).
Long replays and discards show a progress bar and stop cleanly on Ctrl-C,
between two chunks: what is done stays done and nothing is half-moved.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chasqui_core.engine.dlq.entries import REASONS
from chasqui_core.engine.dlq.filter import DLQFilter
from chasqui_core.management.terminal import Interrupt, ProgressBar, fmt_age, fmt_ms, parse_when, shorten, table
from chasqui_core.masking import mask, mask_text
from chasqui_core.models import ApiKey, Operation
from chasqui_core.services import api_keys as api_keys_service
from chasqui_core.services import audit as audit_service
from chasqui_core.services import delayed as delayed_service
from chasqui_core.services import dlq as dlq_service
from chasqui_core.services import background
from chasqui_core.services import jobs as jobs_service
from chasqui_core.services import operations as operations_service
from chasqui_core.services import queues as queues_service
from chasqui_core.services import workers as workers_service
from chasqui_core.services.common import Conflict, InvalidInput, NotFound

class Command(BaseCommand):
    help = ("Inspect and operate Chasqui queues: stats, dead letters, delayed jobs, pause/resume/purge, workers "
            "(quiet/stop), API keys.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--as", dest="as_user", metavar="USER",
                            help="Act (and be audited) as this user; default: the first superuser.")
        sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

        p = sub.add_parser("inspect", help="Queue stats as a table (one queue: with workers and error groups).")
        p.add_argument("queue", nargs="?")

        dlq = sub.add_parser("dlq", help="The dead-letter queue.").add_subparsers(dest="dlq_command", required=True,
                                                                                 metavar="ACTION")
        peek = dlq.add_parser("peek", help="Show dead jobs, newest first.")
        self._filters(peek)
        peek.add_argument("--limit", type=int, default=20, help="How many to show (1-500, default 20).")
        peek.add_argument("--entry", help="Show one entry in full, with its error history.")
        groups = dlq.add_parser("groups", help="Dead jobs grouped by error.")
        self._filters(groups)
        dlq.add_parser("reindex", help="Build the DLQ's index now (for entries written before it existed; "
                                       "the console otherwise builds it a moment per page view).").add_argument("queue")
        for name, text in (("replay", "Send dead jobs back to work."), ("discard", "Delete dead jobs for good.")):
            act = dlq.add_parser(name, help=text)
            self._filters(act)
            act.add_argument("--ids", nargs="+", metavar="ENTRY_ID", help="Act on these entry ids only.")
            act.add_argument("--all", action="store_true", help="Act on every entry (when no filter is given).")
            act.add_argument("--yes", "-y", action="store_true", help="Do not ask for confirmation.")
            if name == "replay":
                act.add_argument("--one-more-attempt", action="store_true",
                                 help="Grant exactly one more attempt instead of a fresh retry budget.")
                act.add_argument("--at", dest="run_at", help="Replay at this time (ISO 8601) instead of now.")
                act.add_argument("--rate", type=int, help="Replay at most this many jobs per second (by filter): "
                                 "a worker of the queue runs it in the background.")

        delayed = sub.add_parser("delayed", help="Delayed jobs.").add_subparsers(dest="delayed_command",
                                                                                required=True, metavar="ACTION")
        lst = delayed.add_parser("list", help="Delayed jobs, soonest first.")
        lst.add_argument("queue")
        lst.add_argument("--limit", type=int, default=20)
        for name, text in (("cancel", "Remove a delayed job for good."), ("run", "Run a delayed job now.")):
            act = delayed.add_parser(name, help=text)
            act.add_argument("queue")
            act.add_argument("job_id")

        for name, text in (("pause", "Workers stop reading the queue."), ("resume", "Workers read the queue again.")):
            sub.add_parser(name, help=text).add_argument("queue")
        purge = sub.add_parser("purge", help="Delete a queue's waiting jobs (those no worker holds yet); running and "
                                             "delayed jobs and the DLQ are left alone.")
        purge.add_argument("queue")
        purge.add_argument("--yes", "-y", action="store_true", help="Do not ask for confirmation.")

        sub.add_parser("workers", help="Workers from their heartbeats, with their ids for quiet and stop."
                       ).add_argument("queue", nargs="?")
        for name, text in (("quiet", "A worker takes no more jobs and finishes those it runs (it keeps running)."),
                           ("stop", "A worker finishes the jobs it runs, then exits.")):
            sub.add_parser(name, help=text).add_argument("worker_id")

        keys = sub.add_parser("apikey", help="API keys.").add_subparsers(dest="apikey_command", required=True,
                                                                          metavar="ACTION")
        create = keys.add_parser("create", help="Create a key (printed once).")
        create.add_argument("--user", required=True)
        create.add_argument("--name", default="")
        keys.add_parser("revoke", help="Revoke a key by its prefix.").add_argument("prefix")
        keys.add_parser("list", help="List keys (prefixes only).")

        sub.add_parser("cancel", help="Cancel a job by id: waiting, delayed or running (it goes to the DLQ as "
                                      "cancelled).").add_argument("job_id")

        ops = sub.add_parser("operations", help="Background operations (big replays/discards).")
        ops.add_argument("--limit", type=int, default=20)
        ops.add_argument("--run", nargs="?", const="", metavar="QUEUE",
                         help="Run the waiting operations (of QUEUE, or of every queue) in this process, for when "
                              "no worker serves their queue; Ctrl-C hands the current one back, to be resumed.")

    @staticmethod
    def _filters(parser: CommandParser) -> None:
        parser.add_argument("queue")
        parser.add_argument("--task", help="Exact task name.")
        parser.add_argument("--reason", choices=REASONS)
        parser.add_argument("--error-class", help="Exception class, with or without module.")
        parser.add_argument("--error-text", help="Text in any error message (case-insensitive).")
        parser.add_argument("--fingerprint", help="One error group: its id, as `dlq groups` prints it.")
        parser.add_argument("--since", help="Died at or after: ISO 8601 or a span ago (30m, 1h, 2d).")
        parser.add_argument("--until", help="Died before: ISO 8601 or a span ago.")

    # --- dispatch -----------------------------------------------------------------------

    def handle(self, *args, **opts) -> None:
        self.actor = self._actor(opts.get("as_user"))
        command = opts["command"]
        handler: Callable[[dict], None] = {
            "inspect": self.inspect,
            "dlq": self.dlq,
            "delayed": self.delayed,
            "pause": self.pause,
            "resume": self.resume,
            "purge": self.purge,
            "workers": self.workers,
            "quiet": self.worker_command,
            "stop": self.worker_command,
            "apikey": self.apikey,
            "operations": self.operations,
            "cancel": self.cancel,
        }[command]
        try:
            handler(opts)
        except (InvalidInput, NotFound, Conflict) as exc:
            raise CommandError(str(exc)) from None
        except PermissionDenied as exc:
            raise CommandError(f"{exc} (acting as {audit_service.actor_label(self.actor)}; see --as)") from None

    def _actor(self, username: str | None):
        User = get_user_model()
        if username:
            try:
                return User.objects.get(**{User.USERNAME_FIELD: username})
            except User.DoesNotExist:
                raise CommandError(f"--as: no user named {username!r}") from None
        return User.objects.filter(is_superuser=True, is_active=True).order_by("pk").first()

    def _say(self, text: str = "") -> None:
        self.stdout.write(text)

    # --- inspect --------------------------------------------------------------------------

    def inspect(self, opts: dict) -> None:
        if opts["queue"]:
            stats = [queues_service.queue_detail(self.actor, opts["queue"], source="cli")]
        else:
            stats = queues_service.queue_overview(self.actor, source="cli")
        rows = [(s.name, "paused" if s.paused else "active", s.stream_length, s.pending, s.in_flight, s.delayed,
                 s.overdue, fmt_age(s.oldest_overdue_age_ms) if s.overdue else "-", s.dlq, s.workers,
                 "-" if s.lag is None else s.lag) for s in stats]
        self._say(table(rows, ("QUEUE", "STATE", "STREAM", "PENDING", "IN-FLIGHT", "DELAYED", "OVERDUE",
                               "OLDEST-OVERDUE", "DLQ", "WORKERS", "LAG")))
        if not opts["queue"]:
            return
        queue = opts["queue"]
        self._say(f"\nWorkers of {queue}:")
        self._workers_table(workers_service.worker_list(self.actor, queue=queue, source="cli"))
        groups = dlq_service.dlq_groups(self.actor, queue, source="cli")[:10]
        if groups:
            self._say(f"\nTop dead-letter errors of {queue}:")
            self._say(table([(g.count, fmt_ms(g.last_seen_ms), shorten(mask_text(g.fingerprint), 80))
                             for g in groups], ("COUNT", "LAST-SEEN", "ERROR")))

    # --- dlq ------------------------------------------------------------------------------------

    def _filter(self, opts: dict) -> DLQFilter:
        since = parse_when(opts["since"]) if opts.get("since") else None
        until = parse_when(opts["until"]) if opts.get("until") else None
        return dlq_service.build_filter(task=opts.get("task"), reason=opts.get("reason"),
                                        error_class=opts.get("error_class"), error_text=opts.get("error_text"),
                                        fingerprint=opts.get("fingerprint"),
                                        since=since, until=until)

    def dlq(self, opts: dict) -> None:
        action = opts["dlq_command"]
        queue = opts["queue"]
        if action == "peek":
            return self._peek(queue, opts)
        if action == "reindex":
            bar = ProgressBar(self.stdout, "Indexing")
            try:
                state = dlq_service.rebuild_index(self.actor, queue, source="cli", progress=bar)
            finally:
                bar.close()
            self._say(f"The dead-letter index of {queue} is ready: {state.indexed:,} entries.")
            return
        if action == "groups":
            groups = dlq_service.dlq_groups(self.actor, queue, filter=self._filter(opts), source="cli")
            self._say(table([(g.id, g.count, fmt_ms(g.first_seen_ms), fmt_ms(g.last_seen_ms), ",".join(g.tasks),
                              mask_text(g.fingerprint)) for g in groups],
                            ("GROUP (use with --fingerprint)", "COUNT", "FIRST-SEEN", "LAST-SEEN", "TASKS", "ERROR")))
            return
        self._act(action, queue, opts)

    def _peek(self, queue: str, opts: dict) -> None:
        if opts.get("entry"):
            dead = dlq_service.dlq_entry(self.actor, queue, opts["entry"], source="cli")
            self._say(f"Entry {dead.entry_id}  job {dead.job_id}  task {dead.task}")
            self._say(f"Died {fmt_ms(dead.dead_at_ms)} UTC, reason {dead.reason}")
            if dead.job is not None:
                self._say(f"args: {mask(dead.job.args)}  kwargs: {mask(dead.job.kwargs)}")
            for record in dead.errors:
                if not isinstance(record, dict):
                    continue
                self._say(f"\n--- attempt {record.get('attempt')} {record.get('class')}: "
                          f"{mask_text(str(record.get('message', '')))}")
                if record.get("traceback"):
                    self._say(mask_text(str(record["traceback"])).rstrip())
            return
        page = dlq_service.dlq_page(self.actor, queue, filter=self._filter(opts), limit=opts["limit"], source="cli")
        total = dlq_service.dlq_count(self.actor, queue, source="cli")
        rows = [(d.entry_id, fmt_ms(d.dead_at_ms), d.task, d.reason, d.error_class, shorten(mask_text(d.error)))
                for d in page.items]
        self._say(table(rows, ("ENTRY", "DIED (UTC)", "TASK", "REASON", "ERROR-CLASS", "ERROR")))
        more = " (more match: narrow the filter or raise --limit)" if page.next_cursor else ""
        self._say(f"\n{len(page.items)} shown of {total:,} in the DLQ of {queue}{more}")

    def _act(self, action: str, queue: str, opts: dict) -> None:
        ids = opts.get("ids")
        f = self._filter(opts)
        if ids and not f.is_empty():
            raise CommandError("Give either --ids or filters, not both")
        if not ids and f.is_empty() and not opts.get("all"):
            raise CommandError(f"Nothing selected: give filters, --ids, or --all to {action} every entry")
        service = dlq_service.replay if action == "replay" else dlq_service.discard
        extra: dict[str, Any] = {}
        if action == "replay":
            extra["reset_attempts"] = not opts.get("one_more_attempt")
            if opts.get("run_at"):
                extra["run_at"] = parse_when(opts["run_at"])
            if opts.get("rate") is not None:
                if ids:
                    raise CommandError("--rate applies to replays by filter (or --all), not to --ids")
                op = service(self.actor, queue, filter=f, source="cli", rate=opts["rate"], **extra)
                self._say(f"Operation {op.pk} recorded: a worker of {queue} replays {op.total:,} entries at most "
                          f"{opts['rate']:,} a second. Follow it with `chasqui operations`.")
                return
        if ids:
            if not opts.get("yes"):
                self._confirm(f"{action.capitalize()} {len(ids)} entr{'y' if len(ids) == 1 else 'ies'} of {queue}?")
            count = service(self.actor, queue, ids=ids, source="cli", **extra)
            self._say(f"{'Replayed' if action == 'replay' else 'Discarded'} {count} of {len(ids)} entries.")
            return
        if not opts.get("yes"):
            matching = dlq_service.dlq_count(self.actor, queue, filter=f, source="cli")
            if matching == 0:
                self._say(f"No entry of {queue} matches; nothing to {action}.")
                return
            described = ", ".join(f"{k}={v}" for k, v in f.to_dict().items()) or "every entry"
            self._confirm(f"{action.capitalize()} {matching:,} entries of {queue} ({described})?")
        bar = ProgressBar(self.stdout, action.capitalize())
        with Interrupt(self.stdout) as interrupt:
            try:
                count = service(self.actor, queue, filter=f, source="cli", background=False, progress=bar,
                                should_stop=interrupt, **extra)
            finally:
                bar.close()
        verb = "Replayed" if action == "replay" else "Discarded"
        if interrupt.requested:
            self._say(f"Stopped: {verb.lower()} {count:,} entries ({bar.done:,} of {bar.total:,} handled); "
                      f"the rest are untouched.")
        else:
            self._say(f"{verb} {count:,} entries.")

    def _confirm(self, question: str) -> None:
        if not sys.stdin.isatty():
            raise CommandError(f"{question} Confirmation needed: add --yes to run without a terminal")
        answer = input(f"{question} [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            raise CommandError("Cancelled; nothing was changed")

    # --- delayed ----------------------------------------------------------------------------------

    def delayed(self, opts: dict) -> None:
        action, queue = opts["delayed_command"], opts["queue"]
        if action == "list":
            page = delayed_service.delayed_page(self.actor, queue, limit=opts["limit"], source="cli")
            self._say(table([(j.job_id, j.task, fmt_ms(j.run_at_ms), j.attempt, shorten(str(mask(j.args)), 40))
                             for j in page.items], ("JOB", "TASK", "RUN-AT (UTC)", "ATTEMPT", "ARGS")))
            if page.next_cursor:
                self._say("(more: raise --limit)")
        elif action == "cancel":
            delayed_service.cancel_delayed(self.actor, queue, opts["job_id"], source="cli")
            self._say(f"Cancelled delayed job {opts['job_id']} of {queue}.")
        else:
            entry_id = delayed_service.run_delayed_now(self.actor, queue, opts["job_id"], source="cli")
            self._say(f"Job {opts['job_id']} moved to the stream of {queue} (entry {entry_id}).")

    # --- cancel -------------------------------------------------------------------------------------

    def cancel(self, opts: dict) -> None:
        done = jobs_service.cancel_job(self.actor, opts["job_id"], source="cli")
        self._say(f"Cancel of job {done.job_id} ({done.state}, queue {done.queue}) recorded: "
                  + ("it will not run." if done.state != "running" else "its worker stops it."))

    # --- pause / resume ------------------------------------------------------------------------------

    def pause(self, opts: dict) -> None:
        changed = queues_service.pause(self.actor, opts["queue"], source="cli")
        self._say(f"Paused {opts['queue']}." if changed else f"{opts['queue']} was already paused.")

    def resume(self, opts: dict) -> None:
        changed = queues_service.resume(self.actor, opts["queue"], source="cli")
        self._say(f"Resumed {opts['queue']}." if changed else f"{opts['queue']} was not paused.")

    def purge(self, opts: dict) -> None:
        queue = opts["queue"]
        waiting = queues_service.waiting_by_band(self.actor, queue, source="cli")
        total = sum(waiting.values())
        if not total:
            self._say(f"{queue} has no waiting jobs; nothing to purge.")
            return
        if not opts["yes"]:
            bands = ", ".join(f"{count:,} {band}" for band, count in waiting.items() if count)
            self._confirm(f"Delete about {total:,} waiting jobs of {queue} ({bands})?")
        self._say(f"Purged {queues_service.purge(self.actor, queue, source='cli'):,} waiting jobs of {queue}.")

    # --- workers ---------------------------------------------------------------------------------------

    def workers(self, opts: dict) -> None:
        self._workers_table(workers_service.worker_list(self.actor, queue=opts["queue"], source="cli"))

    def _workers_table(self, workers: Sequence[Any]) -> None:
        if not workers:
            self._say("  none")
            return
        self._say(table([(w.id, w.host, w.pid, w.supervisor_pid or "-", ",".join(w.queues), w.concurrency,
                          w.in_flight, w.processed, w.failed, fmt_ms(w.last_seen_ms),
                          "stale" if w.stale else w.state) for w in workers],
                        ("ID", "HOST", "PID", "SUPERVISOR", "QUEUES", "CONCURRENCY", "IN-FLIGHT", "PROCESSED",
                         "FAILED", "LAST-SEEN", "STATE")))

    def worker_command(self, opts: dict) -> None:
        send = workers_service.quiet if opts["command"] == "quiet" else workers_service.stop
        sent = send(self.actor, opts["worker_id"], source="cli")
        done = {"quiet": "takes no more jobs and finishes those it runs",
                "stop": "finishes the jobs it runs, then exits"}[opts["command"]]
        if sent.changed:
            self._say(f"Sent {opts['command']} to worker {sent.worker.id}: it {done}.")
        else:
            self._say(f"Worker {sent.worker.id} had been asked already (a stop is not undone by a quiet); "
                      f"nothing was sent.")

    # --- API keys ---------------------------------------------------------------------------------------

    def apikey(self, opts: dict) -> None:
        action = opts["apikey_command"]
        if action == "create":
            row, key = api_keys_service.create_api_key(self.actor, opts["user"], name=opts["name"], source="cli")
            self._say(f"API key for {row.user.get_username()} (prefix {row.prefix}). "
                      f"It is shown once; store it now:")
            self._say(key)
        elif action == "revoke":
            row = api_keys_service.revoke_api_key(self.actor, opts["prefix"], source="cli")
            self._say(f"Revoked key {row.prefix} of {row.user.get_username()}.")
        else:
            rows = ApiKey.objects.select_related("user").order_by("-created_at")
            self._say(table([(k.prefix, k.user.get_username(), k.name, k.created_at.strftime("%Y-%m-%d %H:%M"),
                              k.last_used_at.strftime("%Y-%m-%d %H:%M") if k.last_used_at else "-",
                              "revoked" if k.revoked_at else "active") for k in rows],
                            ("PREFIX", "USER", "NAME", "CREATED", "LAST-USED", "STATE")))

    # --- operations ---------------------------------------------------------------------------------------

    def operations(self, opts: dict) -> None:
        if opts.get("run") is not None:
            with Interrupt(self.stdout) as interrupt:
                ran = background.run_pending(opts["run"] or None, should_stop=interrupt)
            self._say(f"Ran {len(ran)} operation{'s' if len(ran) != 1 else ''}.")
        ops: list[Operation] = operations_service.list_operations(self.actor, limit=opts["limit"], source="cli")
        self._say(table([(op.pk, op.kind, op.queue, op.status, f"{op.done:,}/{op.total:,}", op.count,
                          op.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                          op.created_by.get_username() if op.created_by_id else "-") for op in ops],
                        ("ID", "KIND", "QUEUE", "STATUS", "PROGRESS", "COUNT", "CREATED", "BY")))
