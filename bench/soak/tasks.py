"""The soak's tasks: one per job kind (bench/soak/kinds.py), each writing its runs to the ledger.

Every run appends a ``start`` line before it does anything and an ``end``
line (``ok``, ``error`` with the class, or ``cancelled``) as it finishes
(ledger.py). The end line is written after the run has told the engine that
it ended (``JobContext.run_returned``, what Django's wrapper calls as the task
returns): the engine's promise is that a run that returned is never charged a
death, and a run is not returned at its last line. Written before, an end line
whose thread then waited for the GIL or a core (a crash job in another thread
took the process down meanwhile) showed a run the engine could not know had
ended as a finished run charged: the likely cause of the one the 10-minute
soak met beside busy processes, an end line 150 ms before the crash.

The job id and the attempt come from the task context
(``takes_context=True``), as a Django user would read them. A crash
(``os._exit``) or a hang leaves a start without an end: that is what the
verdict looks for.

The hanging tasks use ``@task(timeout=...)``. On a Chasqui without that
option they are not defined, and the soak refuses to start with them (run
it ``--without hang``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import os
import random
import time
import uuid

from django.tasks import task

from chasqui_core.task import ChasquiTask
from chasqui_core.engine.jobs.errors import UnrecoverableError

from .kinds import BY_NAME, HANG_TIMEOUT, SLEEP_FOREVER
from .ledger import CANCELLED, END, ERROR, EXIT, OK, START, LedgerWriter

LEDGER_ENV = "SOAK_LEDGER"
"""Path of the ledger file every run appends to."""
FIXED_ENV = "SOAK_FIXED_DIR"
"""Directory holding one empty file per ``fixed_by_replay`` job the soak has marked fixed."""

SUPPORTS_TIMEOUT = "timeout" in {f.name for f in dataclasses.fields(ChasquiTask)}
"""Whether this Chasqui's tasks take ``timeout=`` (the hanging kinds need it)."""

_ledger = LedgerWriter(os.environ[LEDGER_ENV]) if os.environ.get(LEDGER_ENV) else None
if _ledger is not None:
    # A clean stop runs the exit handlers; SIGKILL, a crash (os._exit) and the worker's own os._exit with sync
    # runs it could not finish do not: the verdict tells a process that stopped cleanly from one that died by this.
    atexit.register(_ledger.write, e=EXIT)


class SoakFailure(Exception):
    """Raised on purpose by the failing kinds."""


class NotFixedYet(Exception):
    """Raised by ``fixed_by_replay`` until the soak marks its job fixed."""


@contextlib.contextmanager
def _run(context, kind: str):
    """Write the run's start, then its end however the body leaves (a crash or a hang leaves none)."""
    job_id = context.task_result.id
    run_id = uuid.uuid4().hex[:12]
    if _ledger is not None:
        _ledger.write(j=job_id, k=kind, e=START, r=run_id, a=context.attempt)
    try:
        yield job_id
    except BaseException as exc:
        if _ledger is not None:
            _returned(context)
            outcome = CANCELLED if isinstance(exc, asyncio.CancelledError) else ERROR
            _ledger.write(j=job_id, k=kind, e=END, r=run_id, o=outcome, x=type(exc).__name__)
        raise
    if _ledger is not None:
        _returned(context)
        _ledger.write(j=job_id, k=kind, e=END, r=run_id, o=OK)


def _returned(context) -> None:
    """Tell the engine the run has ended, as the task's wrapper does when it returns (see the module's docstring);
    a Chasqui without ``run_returned`` has nothing to tell."""
    run = getattr(context, "_run", None)
    if run is not None and hasattr(run, "run_returned"):
        run.run_returned()


def _opts(kind: str, **extra) -> dict:
    k = BY_NAME[kind]
    return {"queue_name": k.queue, "max_attempts": k.budget, "takes_context": True, **extra}


@task(**_opts("ok"))
def ok(context, n: int) -> int:
    with _run(context, "ok"):
        return n


@task(**_opts("delayed"))
def ok_delayed(context, n: int) -> int:
    with _run(context, "delayed"):
        return n


@task(**_opts("slow_sync"))
def slow_sync(context, n: int) -> None:
    with _run(context, "slow_sync"):
        time.sleep(random.uniform(0.2, 1.0))


@task(**_opts("slow_async"))
async def slow_async(context, n: int) -> None:
    with _run(context, "slow_async"):
        await asyncio.sleep(random.uniform(0.2, 1.0))


@task(**_opts("limited"))
async def limited(context, n: int) -> None:
    with _run(context, "limited"):
        await asyncio.sleep(random.uniform(0.05, 0.3))


@task(**_opts("fail_once"))
async def fail_once(context, n: int) -> None:
    with _run(context, "fail_once"):
        if context.attempt == 1:
            raise SoakFailure(f"job {n} fails on its first run, on purpose")


@task(**_opts("always_fail"))
def always_fail(context, n: int) -> None:
    with _run(context, "always_fail"):
        raise SoakFailure(f"job {n} fails on every run, on purpose")


@task(**_opts("unrecoverable"))
async def unrecoverable(context, n: int) -> None:
    with _run(context, "unrecoverable"):
        raise UnrecoverableError(f"job {n} cannot succeed, on purpose")


@task(**_opts("fixed_by_replay"))
def fixed_by_replay(context, n: int) -> None:
    with _run(context, "fixed_by_replay") as job_id:
        if not os.path.exists(os.path.join(os.environ.get(FIXED_ENV, ""), job_id)):
            raise NotFixedYet(f"job {n} fails until it is fixed and replayed")


@task(**_opts("crash"))
def crash(context, n: int) -> None:
    with _run(context, "crash"):
        os._exit(1)  # kills the whole worker process, as a segfault in a C extension would


@task(**_opts("scheduled"))
def scheduled(context) -> None:
    with _run(context, "scheduled"):
        pass


if SUPPORTS_TIMEOUT:
    @task(**_opts("hang_sync", timeout=HANG_TIMEOUT))
    def hang_sync(context, n: int) -> None:
        with _run(context, "hang_sync"):
            time.sleep(SLEEP_FOREVER)

    @task(**_opts("hang_async", timeout=HANG_TIMEOUT))
    async def hang_async(context, n: int) -> None:
        with _run(context, "hang_async"):
            await asyncio.sleep(SLEEP_FOREVER)


# --- workflows' jobs (producer.py's Workflows): each returns the value a chain passes on -----------------------


class FedWrongly(UnrecoverableError):
    """A chain step or fan-in fed another value than the workflow's: never retried, so the verdict sees it."""


@task(**_opts("flow_ok"))
def flow_ok(context, n: int) -> int:
    with _run(context, "flow_ok"):
        return n


@task(**_opts("flow_fail"))
def flow_fail(context, *args) -> None:
    with _run(context, "flow_fail"):
        raise SoakFailure(f"workflow job {args} fails on every run, on purpose")


@task(**_opts("flow_fixed"))
def flow_fixed(context, value, *args):
    """Fails until the soak marks it fixed and replays it; then passes its first argument on (a chain step is fed
    the previous result there)."""
    with _run(context, "flow_fixed") as job_id:
        if not os.path.exists(os.path.join(os.environ.get(FIXED_ENV, ""), job_id)):
            raise NotFixedYet(f"workflow job {value} fails until it is fixed and replayed")
        return value


@task(**_opts("flow_crash"))
def flow_crash(context, n: int) -> int:
    """Ends its worker process on its first run (a marker file says it did), then succeeds."""
    with _run(context, "flow_crash") as job_id:
        marker = os.path.join(os.environ.get(FIXED_ENV, ""), f"crashed-{job_id}")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return n


@task(**_opts("flow_callback"))
def flow_callback(context, *args):
    """A callback (``args``: what it is) or a chain step fed ``args[0]``, which must equal ``args[1]``."""
    with _run(context, "flow_callback"):
        if len(args) == 2:
            fed, expected = args
            if fed != expected:
                raise FedWrongly(f"fed {fed!r:.200}, expected {expected!r:.200}")
            return fed
        return None
