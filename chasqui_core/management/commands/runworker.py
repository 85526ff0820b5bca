"""``python manage.py runworker emails [queue ...]``: run a Chasqui worker.

With ``--processes N`` (or ``--max-jobs`` / ``--max-memory``) this process
becomes a supervisor (chasqui_core/supervisor.py) and runs the worker itself in
N child processes: the same command, with ``--processes 1``, told by its
environment who supervises it.

Channels ships a ``runworker`` command too; ours wins when chasqui_core is listed
above channels in INSTALLED_APPS, and the ``chasqui.E004`` system check stops
every command (Channels' ``runworker`` included) with that fix when it is not.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import sys

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.tasks import task_backends

from chasqui_core.backend import ChasquiBackend
from chasqui_core.conf import chasqui_settings
from chasqui_core.engine.jobs.backoff import coerce_backoff
from chasqui_core.engine.store.connection import check as check_redis
from chasqui_core.engine.store.connection import connect
from chasqui_core.engine.dlq import retention
from chasqui_core.engine.jobs.errors import InvalidQueueName, RedisConfigError
from chasqui_core.engine.store.keys import validate_queue_name
from chasqui_core.engine.recovery.reclaim import record_death
from chasqui_core.engine.settle.retry import RetryPolicy
from chasqui_core.engine.worker.worker import Worker
from chasqui_core.outbox import OutboxRelay
from chasqui_core.schedules import configured as configured_schedules
from chasqui_core.schedules import afire as fire_schedule
from chasqui_core.services import background
from chasqui_core.supervised_child import RECYCLE_EXIT_CODE, STOPPED_EXIT_CODE, SupervisedChild
from chasqui_core.supervisor import Supervisor
from chasqui_core.supervisor_rules import SupervisorConfig, child_command, cpu_count, describe_exit
from chasqui_core.task_runner import build_registry

WORKER_OPTIONS = ("concurrency", "batch_size", "max_attempts", "backoff", "visibility_timeout", "poll_interval",
                  "shutdown_timeout", "timeout", "max_jobs", "max_memory")
"""Options a supervisor hands on to its children as they were given."""


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise CommandError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise CommandError(f"expected a number of 1 or more, got {number}")
    return number


def _processes(value: str) -> int:
    if value == "auto":
        return cpu_count()
    if not value.isdigit() or int(value) < 1:
        raise CommandError(f"--processes must be a whole number of 1 or more, or 'auto' (one per CPU), got {value!r}")
    return int(value)


def _configure_logging() -> None:
    if not logging.getLogger("chasqui").handlers and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _outbox_relay() -> OutboxRelay | None:
    """Every worker relays the transactional outbox when a backend uses it, through that backend's queues."""
    for backend in task_backends.all():
        if isinstance(backend, ChasquiBackend) and backend.outbox:
            return OutboxRelay(backend.queue).start()
    return None


def _publish_retention(conf, queues: list[str], stderr) -> None:
    """Write the queues' DLQ retention rules where their workers trim by them (engine/dlq/retention.py)."""
    try:
        client = connect(conf.redis_url)
        try:
            retention.publish(client, {queue: conf.dlq_retention(queue) for queue in queues})
        finally:
            client.close()
    except Exception as exc:  # Redis is not up yet: the worker waits for it; the rules stay as last published
        stderr.write(f"warning: could not publish the DLQ retention rules ({type(exc).__name__}: {exc}); "
                     "the rules last published stay in force")


class DeathRecorder:
    """The supervisor's report of a child that ended: its worker's death, recorded on each of its queues.

    Made on the first exit (the supervisor needs no Redis otherwise), with
    short timeouts: a Redis that does not answer delays a child's
    replacement by seconds at most, and its runs are then lost contact.
    """

    def __init__(self, url: str, queues: list[str]) -> None:
        self.url = url
        self.queues = list(queues)
        self.client = None

    def __call__(self, pid: int, code: int) -> None:
        if self.client is None:
            self.client = connect(self.url, socket_timeout=2.0, socket_connect_timeout=2.0)
        record_death(self.client, self.queues, host=socket.gethostname(), pid=pid, how=describe_exit(code),
                     supervisor_pid=os.getpid())


async def _serve(worker: Worker, child: SupervisedChild | None) -> None:
    """Run the worker, and tell a supervisor once it reads its queues (Redis reached, readers started).

    Ready means reading, not merely loaded: the supervisor stops the process a
    successor replaces only then, so the queues are never left unread between them.
    """
    run = asyncio.ensure_future(worker.run())
    if child is not None:
        while worker.runner is None and not run.done():
            await asyncio.wait({run}, timeout=0.01)
        if not run.done():
            child.ready()
    await run


class Command(BaseCommand):
    help = "Run a Chasqui worker for the given queues (Django Tasks of this project only)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("queues", nargs="+", help="Queue names, e.g. emails")
        parser.add_argument("--concurrency", type=int,
                            help="Jobs run at once (default: settings.CHASQUI['CONCURRENCY'] or 10)")
        parser.add_argument("--batch-size", type=int, help="Entries read per XREADGROUP call")
        parser.add_argument("--max-attempts", type=int, help="Worker-wide default budget of runs per job (default 3)")
        parser.add_argument("--backoff", help="Worker-wide default backoff: fixed milliseconds (e.g. 500) or a "
                                              "strategy name (exponential, linear, fixed, retry_after)")
        parser.add_argument("--visibility-timeout", type=int,
                            help="Milliseconds before a silent worker's jobs are reclaimed")
        parser.add_argument("--poll-interval", type=float, help="Promoter poll interval in seconds (default 0.1)")
        parser.add_argument("--shutdown-timeout", type=float, help="Seconds to let running jobs finish on SIGTERM")
        parser.add_argument("--timeout", type=float,
                            help="Seconds a run may take when neither the job nor its task sets a timeout "
                                 "(default: settings.CHASQUI['JOB_TIMEOUT'], else no limit). An async run is "
                                 "cancelled; a sync run is charged and its process replaced under a supervisor")
        parser.add_argument("--no-schedules", action="store_true",
                            help="Do not fire settings.CHASQUI['SCHEDULES'] from this worker (by default every "
                                 "worker may, and one at a time does)")
        parser.add_argument("--processes", default="1",
                            help="Worker processes to run, or 'auto' for one per CPU. Above 1, this process "
                                 "supervises them: it restarts those that die, reloads them one by one on SIGHUP "
                                 "and stops them all on SIGTERM (default 1: one worker, no supervisor)")
        parser.add_argument("--max-jobs", type=int,
                            help="Replace a worker process after it has run this many jobs (it works on until its "
                                 "successor reads, then finishes its running jobs). Starts a supervisor, even with "
                                 "--processes 1")
        parser.add_argument("--max-memory", type=int, metavar="MB",
                            help="Replace a worker process once its resident memory reaches this many MB (checked "
                                 "every 2 s; it works on until its successor reads, then finishes its running "
                                 "jobs). Starts a supervisor, even with --processes 1")

    def handle(self, *args, **options) -> None:
        try:
            for name in options["queues"]:
                validate_queue_name(name)
        except InvalidQueueName as exc:
            raise CommandError(str(exc)) from None
        conf = chasqui_settings()
        try:  # a URL that cannot work stops the command here, in one line, not in every child
            check_redis(conf.redis_url)
        except RedisConfigError as exc:
            raise CommandError(f"{conf.redis_url_setting}: {exc}") from None
        processes = _processes(options["processes"])
        for key in ("concurrency", "batch_size", "max_attempts", "visibility_timeout", "max_jobs", "max_memory"):
            if options[key] is not None and options[key] < 1:
                raise CommandError(f"--{key.replace('_', '-')} must be 1 or more, got {options[key]}")
        backoff = conf.backoff
        if options["backoff"]:
            raw = options["backoff"]
            try:
                backoff = coerce_backoff(int(raw) if raw.isdigit() else raw) or backoff
            except (TypeError, ValueError) as exc:
                raise CommandError(f"--backoff: {exc}") from None
        for key in ("shutdown_timeout", "timeout"):
            if options[key] is not None and options[key] <= 0:
                raise CommandError(f"--{key.replace('_', '-')} must be above 0, got {options[key]}")
        try:
            schedules = [] if options["no_schedules"] else list(configured_schedules().values())
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        child = SupervisedChild.from_environment()
        if child is None and (processes > 1 or options["max_jobs"] or options["max_memory"]):
            self._supervise(processes, options, conf.SHUTDOWN_TIMEOUT)
            return
        worker: Worker | None = None
        if child is not None:
            # Before anything slow: a supervisor that dies while this process loads its tasks still takes it along.
            child.watch_supervisor(lambda: worker.request_stop() if worker is not None else None)
        registry = build_registry()
        if not len(registry):
            self.stderr.write("warning: no Django Tasks found in this project (looked in every app's tasks.py)")
        worker = Worker(
            options["queues"],
            registry,
            url=conf.redis_url,
            concurrency=options["concurrency"] or conf.CONCURRENCY,
            batch_size=options["batch_size"] or conf.BATCH_SIZE,
            policy=RetryPolicy(max_attempts=options["max_attempts"] or conf.MAX_ATTEMPTS, backoff=backoff),
            visibility_timeout_ms=options["visibility_timeout"] or conf.VISIBILITY_TIMEOUT_MS,
            promoter_poll_interval=options["poll_interval"] or conf.PROMOTER_POLL_INTERVAL,
            promoter_lock_ttl_ms=conf.PROMOTER_LOCK_TTL_MS,
            shutdown_timeout=options["shutdown_timeout"] or conf.SHUTDOWN_TIMEOUT,
            job_timeout=options["timeout"] or conf.JOB_TIMEOUT,
            cancel_grace=conf.CANCEL_GRACE,
            priority_mode=conf.PRIORITY,
            max_payload_bytes=conf.MAX_PAYLOAD_BYTES,
            dead_worker_grace_ms=conf.DEAD_WORKER_GRACE_MS,
            max_jobs=options["max_jobs"],
            max_memory_mb=options["max_memory"],
            supervisor_pid=child.supervisor_pid if child is not None else None,
            schedules=schedules,
            fire=fire_schedule,
            signing_keys=conf.SIGNING_KEYS,
            limits=conf.LIMITS,
        )
        _configure_logging()
        tasks_logger = logging.getLogger("django.tasks")
        if tasks_logger.level == logging.NOTSET:
            # Django logs two INFO lines per job (started, finished), which would
            # cost a busy worker most of its throughput. A project that wants
            # them sets the "django.tasks" logger's level itself.
            tasks_logger.setLevel(logging.WARNING)
        signed = f", signed jobs only ({len(conf.SIGNING_KEYS)} key(s))" if conf.SIGNING_KEYS else ""
        self.stdout.write(f"Chasqui worker {worker.id}: queues {', '.join(options['queues'])}, "
                          f"{len(registry)} task(s), concurrency {worker.concurrency}{signed}"
                          + (f", {len(schedules)} schedule(s)" if schedules else "")
                          + "".join(f", limit on {limit.scope}: {limit.describe()}" for limit in worker.limits.limits
                                    if limit.scope in options["queues"] or limit.scope in registry))
        self.stdout.flush()
        _publish_retention(conf, options["queues"], self.stderr)
        relay = _outbox_relay()
        audits = background.OperationAudits(options["queues"])  # DLQ operations' audit entries, when they end
        if child is not None:  # at a limit, ask for a successor and work on until it reads
            worker.ask_successor = child.ask_successor
        # What start-up made (Django, the project's apps and tasks) lives as long as the process: out of the
        # cyclic collector's sight, its full passes stop walking it between jobs.
        gc.collect()
        gc.freeze()
        try:
            asyncio.run(_serve(worker, child))
        finally:
            audits.stop()
            if relay is not None:
                relay.stop()
        code = RECYCLE_EXIT_CODE if worker.recycle_reason else 0
        if worker.stopped_by_operator and child is not None:
            code = STOPPED_EXIT_CODE  # the supervisor must not start another in its place
        if worker.unfinished_sync_jobs:
            # Threads cannot be cancelled; their entries stay pending and are reclaimed.
            self.stdout.write(f"{worker.unfinished_sync_jobs} job(s) were still running; exiting anyway")
            self.stdout.flush()
            os._exit(code)
        if code:
            sys.exit(code)

    def _supervise(self, processes: int, options: dict, default_shutdown_timeout: float) -> None:
        """Run as the supervisor of ``processes`` children, each this command with ``--processes 1``."""
        arguments = ["runworker", *options["queues"], "--processes", "1"]
        if options["no_schedules"]:
            arguments.append("--no-schedules")
        for key in WORKER_OPTIONS:
            if options[key] is not None:
                arguments += [f"--{key.replace('_', '-')}", str(options[key])]
        for key in ("settings", "pythonpath"):
            if options.get(key):
                arguments += [f"--{key}", options[key]]
        config = SupervisorConfig(
            command=tuple(child_command(sys.argv[0], arguments)),
            processes=processes,
            shutdown_timeout=options["shutdown_timeout"] or default_shutdown_timeout,
            on_child_exit=DeathRecorder(chasqui_settings().redis_url, options["queues"]),
        )
        _configure_logging()
        self.stdout.write(f"Chasqui supervisor {os.getpid()}: {processes} worker process(es) for queues "
                          f"{', '.join(options['queues'])}")
        self.stdout.flush()
        sys.exit(Supervisor(config).run())
