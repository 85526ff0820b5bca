"""The results page's sections written by hand: what the Django path's costs were and what removed them, the
sync lane's rebuild, the console at scale, what a workflow costs.

They hold figures measured by hand (profiles, in-process turns) that no scenario reproduces on its own, so
``report.py`` copies them into docs/benchmarks.md as they are; keep them true when the code they describe
changes. Kept apart from ``report.py``, which builds the page's measured parts.
"""

COSTS = """\
## The Django path: what cost what

Profiled with `python -m bench --profile DIR` and cProfile (issue 11). Before that work, `runworker` drained
about 4,500 noop jobs/s against 120,000+ for the engine, `task.enqueue()` ran at about 73% of `Queue.add`, and
there was no `enqueue_many`.

- **Signals were thread hops.** Every job sent `task_started` and `task_finished` with `Signal.asend`; Django's
  own receivers are synchronous, so each job paid two `sync_to_async` hops. `chasqui_core/task_signals.py`
  calls Django's logging receivers inline (skipping them when their logger would drop the record) and keeps
  Django's `send`/`asend` for any receiver a project connects.
- **Two log lines per job.** At INFO, Django logs each task's start and finish: 40,000 writes for 20,000
  jobs, most of a worker's time. `django.tasks` logs at WARNING in the project's settings and under
  `runworker` unless a project sets it; final failures still log at ERROR. Per-job retry and dead-letter
  lines of the worker are capped at 20 a second, with a summary line for the rest.
- **Objects nobody read.** A `TaskResult` (with `normalize_json` over the arguments) and a `TaskContext` per
  job are now built only when the task takes a context or a receiver acts; `JobContext` is a plain slotted
  class.
- **Signal checks per run.** Django's finish receiver logs a failure at ERROR, which is on at WARNING, so the
  "nobody listens" shortcut never applied: every async run went through the full observed wrapper and five
  receiver checks. Now a run asks two questions (does anything act on a start, on a success?) and, when
  nothing does, runs inside a small guard that sends `task_finished` only if it fails for good; each check
  is one lookup of the level per status and one `isEnabledFor`. About 15% of runworker's CPU per job.
- **Connection hygiene.** `close_old_connections()` ran twice per job in every sync thread; it now runs
  only in a thread that opened a database connection.
- **Enqueue.** `validate_task` runs once per task object and backend, which then keeps the task's queue and
  job options with it; one `enqueue()` builds its job and sends it with `Queue.add_built`, without the
  batch path's chunking; `ChasquiTask.get_backend` skips the import statement Django's runs per call; the
  READY `TaskResult` is built without re-normalising arguments already checked; the transaction is only
  looked at when an on-commit option is on. `enqueue_many` encodes every call first, sends one `enqueue.lua` call per 1,000 jobs, and
  builds its batch with garbage collection paused (collections walking the whole process cost more than
  the batch itself).
- **Retries.** One events entry per settled batch of retries instead of one per job, and the text of a
  traceback remembered by its path through the code. A failure's description used to be cached by its
  message too: a message of its own per job ("job 17 fails", "order 1234 not found", as in `runworker-retry`)
  missed every time and walked each frame's line table, about 30 µs per failure. Now only the frames'
  text is remembered and the exception's last line is added to it.
- **Slots that woke for nothing.** Async jobs ran in `concurrency` slot coroutines parked on one event:
  each batch woke every idle slot, and with retries coming back in small batches most found the inbox empty
  again. Each job now runs in a task of its own, started eagerly, so a job that never waits finishes
  without a trip through the event loop. worker-retry's CPU per job fell by about a fifth.
- **A context's TaskResult.** A task that takes a context had its TaskResult, TaskErrors and worker ids
  built on every run, though most tasks only read `context.attempt`. The context now builds it when the task
  first reads `context.task_result`. runworker-retry went from ×2.2 to about ×1.25 of worker-retry's CPU per job.
- **Measuring enqueue.** `queue-add` and `django-enqueue` ran minutes apart and single round-trip rates swung
  by a quarter between repeats on a shared host, more than the Django layer costs. `django-enqueue` now
  takes turns with a `Queue.add` loop in the same scenario and is shown against it, with CPU per call.
- **A failure seen before.** `describe` now also remembers whole descriptions by path, class and message:
  a job failing the way others failed (the same line, the same "connection refused") costs a walk over its
  frames and one lookup. Counted with callgrind on an in-process drain (instructions are not disturbed by
  the host's other tenants): 258,000 → 247,000 instructions per retried job, against 75,000 for a noop job.
- **Measuring retries.** `worker-retry` (and `worker-delayed-e2e`, for its goal of 90%) takes turns with a
  `worker-concurrent` drain of the same size in the same worker process and is shown against it. What
  remains per retried job, beside its two runs, is a row
  of small steps of one to three µs each: describing the failure, deciding the backoff, building the error
  record, encoding the new envelope, and decoding it again (msgpack builds the record's nine-key map more
  slowly than nine list items), plus the settler's and the promoter's shares. A failed run now packs its
  new envelope straight from the job, without building a copy of it first, and builds its error record with
  its backoff in one go: 246,300 → 241,900 instructions per retried job (noop: 74,200), so the CPU ratio of
  about ×3.3 to a noop job is what the instructions say, not the host. On the server, a retried job costs
  about 26 µs of script time against 6 for a noop job; deleting settled entries (one XDEL per batch, which
  seeks each id in its stream node) is the largest single part of both, about 3 µs per entry.
- **enqueue_many.** A TaskResult is built for every call; its fields are now set through the setters of
  TaskResult's slots, not `object.__setattr__` by name (half its cost), and a call given as an
  `(args, kwargs)` tuple is checked in three exact type checks. Counted with callgrind: 92,800 → 82,000
  instructions per job, against 52,000 for `Queue.add_bulk` (the rest: a READY TaskResult per job, the
  backend's meta checked per job). `django-enqueue-many` now takes turns with `Queue.add_bulk`, chunk by
  chunk: measured minutes apart on a shared host, the two came out between 0.40 and 0.65 of each other.
- **Measuring runworker.** The `runworker-*` rows were compared with engine rows run minutes earlier;
  each runworker drain now takes turns with a drain of its engine twin, so both see the same machine.
- **Promoting while workers drain.** In turns with `worker-concurrent`, `worker-delayed-e2e` reached 0.85–0.87
  of it with the same CPU per job: the worker was not busier, it was waiting. Redis runs one script at a time,
  and a `promote.lua` call of 1,000 entries held the server for about 2 ms, with a second one queued behind
  it, so the worker's fetches and settles waited too. Batches of 200 hold it about half a millisecond:
  0.90–1.0 over several runs, for about a tenth more server CPU per promoted job when nothing else is running
  (each call costs some 50 µs of server time whatever its size).
- **What a sync job pays around its task.** Counted with callgrind on the real `runworker` process (backlog
  loaded by another process; the difference of a 4,000-job and a 2,000-job drain, so start-up cancels).
  The connection check before and after each job read a thread-local flag with `getattr(local, name,
  False)`: in a thread that never opened a connection that raised and caught an AttributeError twice per
  job, 12,500 instructions of 179,000. It reads a class default now. A task's `RunContext` sets its four
  slots through their own setters (1.2 → 0.65 µs a run), and `decode` checks an envelope's fields as
  locals before building the Job (2.0 → 1.7 µs a delivery, on every path). A `runworker` sync job now counts
  about 82,000 instructions against 65,000–71,000 for the engine's (thread scheduling moves the count a
  little from run to run); the Django wrapper, its context and signal checks are most of the difference.
- **Where the promoter's goal stands.** One `XADD` from Lua costs the server 1.6–3.7 µs on this host,
  depending on the minute (a loop of 200,000 in one `EVAL`, on Redis 7 and on Valkey); moving 500,000 entries
  a second needs 2 µs per entry for everything: `XADD`, its share of `ZRANGEBYSCORE` and
  `ZREMRANGEBYRANK`, and the call. On a slow day that is above what the server can write at all (the
  pipelined-`XADD` ceiling in the first row); the promoter stays at about 0.7 of that ceiling.
- **enqueue_many's TaskResults while the server works.** `Queue.add_bulk` builds its next chunk while the
  server runs the last; `enqueue_many` cannot (every call is checked before anything is sent), so in a
  1,000-call batch the client built, then sent, then waited. The READY TaskResults (about 2.5 µs a call)
  need nothing from the reply: they are now made once the chunk is sent and before its reply is read.
  Same CPU, less waiting: in turns with `add_bulk`, 0.61–0.77 of it before, 0.73–0.99 after.
- **What one add costs.** The goal for `queue-add` asks for about one round trip per call, so `queue-add`
  now takes turns with a bare round trip (a PING on a connection like `Queue.add`'s) and is shown as a
  fraction of it. On this host a round trip was 40 µs (the send alone about 9 µs: loopback TCP on a virtual
  machine wakes the other side through the hypervisor) and an add about 100 µs: `enqueue.lua` runs 25 µs
  on the server for one job, building the job about 8 µs, and sending a few hundred bytes instead of
  fourteen the rest. Of the script's 25 µs, its seven commands take about 5 µs; a bare `EVALSHA` costs 4 µs
  and each `redis.call` 3–6 µs more than its command (`TIME` alone: 6.5 µs). Each of the seven is needed: the
  lane's `GET` and `SET` make a re-sent add harmless, `TIME` dates the counters, three `HINCRBY` keep them.
  15,000 adds a second would need 67 µs a call, all in.
- **What a retried job pays through Django.** Sampled with `--profile` (runworker-retry beside its engine twin,
  per retried job on a slow day of this host: 84 µs of CPU against 60): the task takes a context, so both runs
  go through the observed wrapper (a `RunContext` each, the signal checks: about 11 µs with the task's own
  body); its failure has a message of its own per job ("job 17 fails"), which `describe` cannot take whole
  from its cache (about 5 µs more than a repeated message); and its traceback has the wrapper's frames, a
  longer text to pack, settle and decode (about 3 µs). Each is a step of a few µs; none stands out. The same
  profiles show no cost from garbage collection, and a retried job's CPU ratio to a noop job (×3.1–3.7) is
  what its instructions say: two runs, and the failure between them.
- **What counting every job costs (issue 27).** A worker now notes the runs under way in a start journal
  (`chasqui_core/engine/recovery/journal.py`), so a crash charges only them. Measured in-process on this host, the
  base commit and this one draining the same jobs in turns (minimum and median CPU per job of five drains):
  an async noop job costs no more than before (9.5 / 10.3 µs against 10.7 / 11.2): a job that finishes
  without waiting is never written, and the others go out in one send per dispatch. A sync noop job costs
  about 7 µs more (median 21 µs against 14, ranges 18-24 and 12-16): each run's mark is a `send()` of its own before the handler
  starts, so that a job that kills its process at once is still charged, and a loopback TCP send costs that
  much system time on this virtual machine. Python's own `send` first cost twice that, handing the GIL
  between ten threads on every job; it then kept the GIL (libc's `send` through `ctypes.PyDLL`, never
  blocking), until the sync lane woke few threads (below, *The sync path won back*). Handing jobs only to free threads, with one send per hand-over, cost more (threads waiting for
  the event loop between jobs). For jobs that do real work (a query, a request) the 7 µs vanish; for noop
  sync jobs it is the price of exact crash charges.
- **What limits cost a worker without any.** Rate and concurrency limits (`chasqui_core/engine/worker/limits.py`) are
  checked per batch only when the worker has a limit; otherwise each batch pays one truth test and each run one
  attribute test. Measured in-process on this host, the commit before limits and the one with them draining
  20,000 noop jobs in turns (eight drains each, minimum / median CPU per job): async 9.5 / 10.9 µs before,
  9.8 / 10.5 µs with limits; sync 17.4 / 18.8 µs before, 16.8 / 20.8 µs with limits: inside this host's noise.
"""

SYNC_SPEED = """\
## Sync tasks at engine speed

Issue 38: most Django tasks are plain functions, run by the sync lane's threads. Profiled with py-spy
through `runworker --concurrency 100` ([profiles/](profiles/README.md): where a noop job's time goes, sync
and async, before and after), the sync path paid for every job a token, a thread woken and the GIL
handed from the loop to that thread and back; the async path paid for an OpenTelemetry span that recorded
nothing (the API installed, no SDK).

- **The sync lane wakes few threads.** A woken thread takes jobs until none waits; the loop wakes a thread
  only when none is awake; when a job has waited a whole millisecond (the awake threads are in slower
  jobs), it wakes as many again as are awake. Quick jobs run on one or two threads, slow ones (a query, a call to
  another service) still spread over the whole `--concurrency` within a few milliseconds
  (`tests/engine/test_sync_lane.py`: a burst of jobs that can only finish together, and jobs of half a millisecond of I/O). No lock per job:
  sleeping threads leave their own wake-up queue on a deque, which the loop pops.
- **No span without a tracer provider.** `chasqui_core/tracing.py` makes no span when no provider is
  installed and there is no trace context to pass on (and asks the API, which reads the environment, at most
  once a second); a project with an SDK gets its spans as before.
- **Measured, not adopted.** uvloop as the worker's loop: CPU per async noop job through runworker 17.5 and
  19.5 µs against 19.0 and 18.7 µs with asyncio, in turns at load 24: inside this host's noise, so it is not
  an extra. msgspec's typed decode of an envelope took 2.4 µs against 6.9 µs for `envelope.decode` (which
  builds the `Job` and checks every field); taking it means a `Job` that is a msgspec struct, not done yet.
- **Still to do.** The start journal is a sixth of a sync run's held time (one `send()` per job holding the
  GIL), above the issue's 5%: it needs several jobs' marks in one send. `Queue.add` is still below its
  goal: see *Enqueue at one round trip*, below.

The issue's rows, each as a fraction of its yardstick measured in turns with it in the same run (the rate,
then the CPU per job against the yardstick's). The load average is given at the start and end of each run:
other work shared this 2-core host, so a single run's rates swing widely; the CPU ratio is the steadier
figure.

| Row | before (load 0.52 → 17.61) | before (load 12.72 → 10.97) | after, lane with a lock (load 24.02 at the start) | after, run 1 (load 21.93 → 23.09) | after, run 2 (load 18.04 → 12.21) | after, run 3 (load 10.48 → 20.99) | Goal |
|---|---|---|---|---|---|---|---|
| runworker sync tasks, --concurrency 100, of the engine's async drain (worker-concurrent) | — | 0.56 (CPU ×2.62) | 0.43 (CPU ×2.19) | 0.45 (CPU ×2.35) | 0.78 (CPU ×1.68) | 1.17 (CPU ×1.61) | ≥ 0.6 |
| runworker sync tasks, --concurrency 10, of the engine's sync drain (worker-sync) | 0.63 (CPU ×1.66) | — | 0.62 (CPU ×1.36) | 0.30 (CPU ×1.65) | 1.88 (CPU ×1.00) | 0.76 (CPU ×1.17) | — |
| runworker async tasks, of the engine's drain (worker-concurrent) | 0.28 (CPU ×2.25) | — | 0.91 (CPU ×1.31) | 3.02 (CPU ×0.97) | 1.03 (CPU ×1.08) | 1.09 (CPU ×1.13) | ≥ 0.8 |
| each job fails once (async), of the engine's (worker-retry) | 0.45 (CPU ×2.19) | — | 1.26 (CPU ×1.30) | 0.79 (CPU ×1.33) | 0.59 (CPU ×1.24) | 0.43 (CPU ×1.36) | ≥ 0.5 |
| `task.enqueue` loop, of a `Queue.add` loop | 0.75 (CPU ×1.51) | — | 0.72 (CPU ×1.31) | 0.83 (CPU ×1.24) | 0.65 (CPU ×1.25) | 0.68 (CPU ×1.13) | ≥ 0.8 |
| `Queue.add`, of one bare round trip (PING) | 0.28 (CPU ×3.58) | — | 0.25 (CPU ×3.21) | 0.26 (CPU ×3.21) | 0.29 (CPU ×3.00) | 0.22 (CPU ×3.00) | ≥ 0.7 |

"After, lane with a lock" is an intermediate version (its lane took a lock per job handed to it, which the
next change removed); "after, run 1" lacks the last change to tracing; runs 2 and 3 are the code of this
page but for the lane's last rule for waking more threads (quick I/O jobs), which does not touch noop
drains. The goal column is the issue's. In runs 2 and 3 the sync drain at `--concurrency 100` reached 0.78
and 1.17 of the engine's async drain with 1.68 and 1.61 times its CPU per job (2.62 before), and the async
drain 1.03 and 1.09 with 1.08 and 1.13 times (2.25 before): both goals met twice. A retried job reached
0.59 and 0.43 of the engine's (CPU ×1.24 and ×1.36, from ×2.19): the rate goal held in one run of two.
`task.enqueue` reached 0.65 and 0.68 of `Queue.add` (CPU ×1.25 and ×1.13, from ×1.51) and `Queue.add`
0.22 to 0.29 of a round trip: those two goals were not met by the worker's changes; the producer's follow.

### Enqueue at one round trip

`Queue.add` wrote one job with `enqueue.lua`: a chunk script (a msgpack array of jobs, `TIME`, the lane's
`GET` before anything, the prelude's helpers defined on each call, the reply packed for the lane), about
20–25 µs of server time for one job against 1–2 µs for a bare `XADD` (`INFO commandstats`, embedded Valkey
9.1 and Redis 7.0 on this host at load 5–8). Each `redis.call` costs 1–2 µs beyond its command here, so
what counts is how many a plain job makes.

- **A script for the plain job.** A single job ready now, of the default priority, without a caller-given
  id (`Queue.add` and `task.enqueue()` without options) runs `enqueue_plain.lua`: the `XADD`, the three
  `enqueued` counters (dated by the entry id, no `TIME`), the lane record; loaded without the prelude, the
  envelope its own argument, the entry id its reply. 13–18 µs a call at the same load. `enqueue.lua` keeps
  every other add, and reads the lane only when a write is re-sent (both scripts: a first try cannot find
  its own number). Why each of the five writes stays, and why not `MULTI` or a plain pipeline:
  [architecture.md](architecture.md), "Enqueue".
- **The client.** A task's job options are checked and encoded once (`Queue.template`: the Django backend
  keeps one per task, `Queue.add` one per task name for jobs without options), so an add checks only its
  arguments (flat ones with one set test); the call is packed once per link but for its last three
  arguments (`producer/wire.py`); the link's socket stays non-blocking and it waits with `poll`, where it
  switched the socket's timeout off and on around every read (four `fcntl` calls an add).
- **The retry window.** It now opens when the add begins and bounds every wait of its tries: a blackholed
  add (`bench/faultproxy.py`) with the default 5 s window raised `EnqueueUnavailable` after 10.06 s before
  (the first try waited out the socket's 5 s timeout, then the window began), 5.01 s now.
- **The yardstick.** `queue-add` takes turns with a bare `XADD` of a job like `Queue.add`'s (the issue's
  yardstick; it was a `PING`, a few µs cheaper).
- **Profiles.** cProfile of 20,000 `task.enqueue()` calls before and after:
  [profiles/enqueue.md](profiles/enqueue.md).

Measured with `python -m bench queue-add django-enqueue --repeats 1`, the commit before (`f0a65ca`, run
with this bench) and this one taking turns, three runs each, on this shared 2-core host:

| Row (three runs of each, in turns) | before, load 5.8 / 7.8 / 7.9 | after, load 5.8 / 7.9 / 7.8 | before, load 7.5 / 9.5 / 9.3 | after, load 9.2 / 9.4 / 8.4 | Goal |
|---|---|---|---|---|---|
| `Queue.add`, of a bare `XADD` round trip | 0.25 / 0.28 / 0.27 (CPU ×3.57 / ×3.72 / ×3.55) | 0.46 / 0.48 / 0.41 (CPU ×2.37 / ×2.39 / ×2.28) | 0.24 / 0.31 / 0.29 (CPU ×3.75 / ×3.36 / ×3.47) | 0.40 / 0.36 / 0.36 (CPU ×2.42 / ×2.84 / ×2.59) | ≥ 0.7 |
| `task.enqueue` loop, of a `Queue.add` loop | 0.86 / 0.91 / 0.97 (CPU ×1.20 / ×1.10 / ×1.10) | 0.79 / 0.97 / 0.86 (CPU ×1.06 / ×1.02 / ×1.20) | 1.12 / 0.93 / 0.88 (CPU ×1.04 / ×1.14 / ×1.12) | 0.95 / 0.85 / 0.93 (CPU ×1.05 / ×1.19 / ×1.16) | ≥ 0.8 |
| `Queue.add`, CPU per call (this process) | 54 / 52 / 62 µs | 36 / 36 / 35 µs | 73 / 54 / 56 µs | 43 / 64 / 50 µs | — |
| `Queue.add`, calls/s | 8,570 / 10,532 / 6,613 | 12,326 / 15,508 / 9,098 | 4,656 / 6,036 / 5,423 | 12,428 / 4,398 / 6,155 | — |

The server's time per call (`INFO commandstats`, 8 rounds of 1,000 calls, median and lowest; load 7):

| Server time per call | Valkey 9.1 (embedded) | Redis 7.0 |
|---|---|---|
| `enqueue.lua` before, one job | 23.9 µs (21.6) | 23.3 µs (19.8) |
| `enqueue.lua` now, one job (what a job with options still takes) | 22.9 µs (19.6) | 20.7 µs (19.9) |
| `enqueue_plain.lua` | 16.1 µs (12.9) | 13.9 µs (13.1) |
| a bare `XADD` | 1.2 µs (1.0) | 1.4 µs (1.1) |

`Queue.add` reached 0.36–0.48 of a bare `XADD` round trip, from 0.24–0.31 (CPU per call from 3.6 to 2.4
times the `XADD`'s, median of six runs each): the goal of 0.7 is not met. What is left is mostly the
server's: the plain script's five writes cost it 12–15 µs more than one bare `XADD`, about half of a round trip on this host, and each of
them keeps a promise (the job, its counters agreeing with the stream, a retry that cannot add it twice).
Closing the gap takes fewer writes per add: counters kept elsewhere than three hashes per add, or a server
that deduplicates `XADD` itself (Redis 8's `IDMP`). `task.enqueue` stayed at 0.79–0.97 of `Queue.add`
(CPU ×1.02–1.20, median ×1.11 as before) while `Queue.add` itself got a third faster: the goal of 0.8 held in five runs of six
(0.79 in the sixth). Three more runs of this code at load 12–15 gave 0.39–0.40 of the `XADD` (CPU ×2.45–2.64) and
0.85–1.07 for `task.enqueue`; polling the socket for a reply by time instead of by tries (200 µs) measured no
better there (0.36–0.38) and was left out.

### The sync path won back (worker side)

Between `7c0a235` and `d26fc9e` a noop sync job's worker CPU had grown by about a sixth (17.4 → 20.3 µs
measured idle, issue 38). Profiled (py-spy `--gil`, cProfile call counts, callgrind instruction counts of a
1,000- and a 3,000-job drain: 183,000 → 210,000 instructions per job), the growth was spread over small steps
of Python per job, and the start journal's send was the largest single part: the lane alone (its threads and
journal, no reader or settler) took 7.4 µs of CPU per job with the journal and 3.6 without, in turns. Removed
per job, without changing what is marked or when (each run marked before its handler starts, struck before its
outcome is handed on, one send per run):

- **The run in the thread's loop.** A lane thread runs each job inline (no call for the run, none for the
  wake-up check), with one clock read for the next job's start, used for both its mark and its outcome.
- **One format per mark.** The journal makes an HSET's and an HDEL's head once per stream; a thread's strike
  and next start are one `%` of them, sent inline.
- **No ctypes.** The mark goes out with the journal connection's own `send`, made non-blocking. ctypes kept
  the GIL because the lane once woke a thread per job and ten threads took the GIL from each other on every
  send; the lane now wakes few threads, and in turns the lane alone took 3.6–6.3 µs of CPU per job with
  Python's `send` against 7.6–8.8 with the ctypes call. The commands stay written by hand: redis-py's encoder
  costs more than a noop job's whole time in its thread.
- **Fed in batches.** A read's sync jobs go to the lane in one call (`submit_many`): its
  checks and its wake-up once per read.
- **Less per outcome.** The settler clears its idle event when outcomes start to wait, not per outcome; the
  Django wrapper looks at the thread's connection flag before calling `check_connections`.

Measured with `python -m bench worker-concurrent worker-sync runworker-sync runworker-sync-100 --repeats 1`,
three turns of `7c0a235`, `d26fc9e` (before) and this change (after), taking turns on this host while other
work loaded it (load average at the start of each turn, before / after: 16.7 / 13.0, 10.6 /
8.9, 6.7 / 5.7; `7c0a235`: 15.4, 11.5, 6.6). Worker CPU per noop job, median (the three turns), and the median
rate:

| row | `7c0a235` | before (`d26fc9e`) | after |
|---|---|---|---|
| worker-concurrent (async, c=100) | 21.2 µs (21.4 / 21.2 / 17.5); 23,085 jobs/s | 26.2 µs (26.1 / 27.0 / 26.2); 19,451 jobs/s | 22.3 µs (22.3 / 26.0 / 19.5); 27,459 jobs/s |
| worker-sync (c=10) | 33.2 µs (35.1 / 33.2 / 25.2); 15,856 jobs/s | 33.6 µs (34.8 / 33.4 / 33.6); 13,351 jobs/s | 29.1 µs (29.1 / 33.8 / 26.1); 19,425 jobs/s |
| runworker-sync (`@task`, c=10) | 33.8 µs (33.8 / 28.1 / 36.2); 19,723 jobs/s | 34.4 µs (34.4 / 32.8 / 40.8); 18,571 jobs/s | 35.0 µs (35.0 / 42.6 / 33.7); 18,797 jobs/s |
| worker-sync (beside runworker-sync) | 32.4 µs (32.4 / 22.8 / 36.3); 20,265 jobs/s | 33.2 µs (34.8 / 22.5 / 33.2); 20,647 jobs/s | 24.9 µs (24.4 / 30.1 / 24.9); 22,743 jobs/s |
| runworker-sync-100 (`@task`, c=100) | — | 34.8 µs (32.0 / 34.8 / 35.0); 18,426 jobs/s | 32.1 µs (32.1 / 26.8 / 32.4); 22,796 jobs/s |

After against before, turn by turn: worker-sync CPU ×0.84, ×1.01, ×0.77 (rate ×1.51, ×1.40, ×1.26);
worker-concurrent ×0.85, ×0.96, ×0.75. The runworker-sync row swung more than it moved (×1.02, ×1.30, ×0.83),
so it was measured again on its own, two turns each of before, the change with ctypes kept, and after, at load
3.8–5.9: 39.8, 30.3 and 28.6 µs (medians), its engine twin 33.1, 30.7 and 27.8. Issue 38's row for sync tasks
at `--concurrency 100` against the engine's async drain (goal ≥ 0.6): 0.76, 0.68, 0.69 before (CPU ×1.19,
×1.30, ×1.48), 0.93, 1.07, 0.76 after (CPU ×1.34, ×1.05, ×1.60). On this host at these loads the CPU per job
is about 1.5–2 times what an idle host shows, and a single turn moves by a third; what the turns agree on: no
row is worse than at `7c0a235` beyond that noise, the engine's sync rows are cheaper than before.

Two more turns of before and the final code of this change (every sync job through `submit_many`; the bench's
noop jobs take the same path as above), at load 5.3 / 5.9 and 6.2 / 5.3, after against before: worker-sync CPU
×0.93, ×1.01 (its twin beside runworker-sync ×0.85, ×0.83), runworker-sync ×0.95, ×0.96 (rate ×1.07, ×1.16),
runworker-sync-100 ×0.91, ×1.33, worker-concurrent ×1.04, ×1.07 (rate ×0.99, ×0.93); medians 28.7 against 29.4
µs for worker-sync, 33.7 against 35.2 for runworker-sync, 22.4 against 21.2 for worker-concurrent. Issue 38's
row at `--concurrency 100` reached 0.72 and 0.60 of the engine's async drain (CPU ×1.32, ×1.67), before 0.51
and 0.82.

What remains is the send itself: one system call per sync run, about 2.5 µs on this virtual machine (a
loopback TCP send wakes the server through the hypervisor), a sixth of a noop sync job where issue 38 asks
for 5 %. Two sends cannot become one without marking a run that has not started (a crash would then charge
it) or striking late (a crash after a run returned would charge it); batching starts the way async rounds
are (`dispatching`) would turn a sync pill's first death into a recovery, a change of the crash accounting.
Below that needs the journal outside Redis (a shared-memory journal read by the supervisor, issue 35).
"""

CONSOLE = """\
## The console at scale

`python -m bench console-scale` (`--console-size N`, default 1,000,000) builds a DLQ the way workers
write it and times what the console asks of it. Measured 2026-11-26 with `python -m bench console-scale
--repeats 1` (median of 3 timed calls after a warm-up; the host's load average was 4–5 on its 2 cores, shared),
on 1,000,000 dead jobs (2,000 from a real worker, 998,000 through `settle.lua`), beside 1,000,000 delayed and
100,000 waiting jobs:

| Action | Goal | Before the index | Measured |
|---|---|---|---|
| Grouped view over the whole DLQ | < 300 ms, counts that add up | 37 s at 200,000 (newest 100,000 only) | 0.8 ms; 1,000,000 of 1,000,000 entries counted |
| Filter by task, first page (10 match) | < 300 ms, complete page | up to ten *Older* clicks of 3–6 s | 0.9 ms, 10 of 10 |
| Filter by error class / group / reason (1,001 match) | < 300 ms, complete page | as above | 1.8 / 4.1 / 4.7 ms, 50 of 1,001 |
| Filter by task and reason (125 match) | < 300 ms, complete page | as above | 11 ms, 50 of 125 (1,000 index ids read) |
| Count of a filter (confirmation before a bulk action) | < 1 s | 25 s for ~100,000 matching | 0.2 ms (333,000 matching); 9 ms (task and reason) |
| Find a dead job by id | < 100 ms | 0.7–1.1 s | 30 ms (15 ms on a quieter run) |
| Find a waiting / finished job by id | < 100 ms | 3–7 ms / < 1 ms | 7 ms / 0.15 ms |
| Find a delayed job by id | < 100 ms | 0.6–0.7 s | 57–532 ms, median 277 ms: **not met** (no index, see below) |

The index costs memory and a little of the dead-letter path: about 400 MB per million dead jobs (four
sorted-set members and a job-id field each; a million such entries take about 1 GB themselves), and 15–30 µs per
dead job in `settle.lua` (measured on batches of 1,000 dead jobs, with and without the index's writes:
20–22 µs a job without, 36–51 µs with). Completions and retries do not touch it. Replays and discards
undo it in the same call: discard by id about 11,000 entries/s (plain XDELs before). Entries written
before the index (an upgrade) are indexed at about 10,000 a second (`manage.py chasqui dlq reindex`, or a
moment per console read); their index also keeps each one's group in a hash, about 100 MB more per million
(`dlq-page`: 1,519 MB for 1,000,000 plainly written entries once indexed, 1,011 MB before). The delayed set stays unindexed: every retry, delayed add and promotion would
pay for it on the hot path, and a lookup is one server-side `ZSCAN MATCH` of up to 0.7 s at a million.
"""


WORKFLOWS = """\
## Workflows: what a batch costs

Measured with `python -m bench flows --repeats 5` on 2026-11-28 (2-core host shared with other test runs, load
average 1.33 at the start): one worker process (concurrency 100, async noop handler) drains, in turns within each
round, 10,000 noop jobs enqueued plainly, a batch of 10,000 noop children with an `on_success` callback, and a
fan-in chain (the same batch, then a step fed the list of its 10,000 results). A workflow's rate counts its
children over a window that ends when its callback or last step, which the last child's settle call enqueues, has
run.

| row | median of 5 | against the plain drain of the same round | CPU per job |
|---|---|---|---|
| plain drain (beside the workflows) | 29,910 jobs/s | — | 23.4 µs |
| batch of 10,000 + `on_success` | 26,805 children/s | 0.80, 0.89, 0.99, 0.83, 0.76 (median 0.83) | 24.8 µs (×1.06) |
| fan-in chain (batch of 10,000, then `total`) | 26,514 children/s | 0.71, 1.00, 1.28, 0.74, 0.75 (median 0.75) | 24.3 µs (×1.04) |

The worker's CPU per child is 4–6 % above a plain job's: each child's end travels in its settle call (five
fields) and costs one `HSETNX` in `flows.lua`, while the counts, the check for due callbacks and the callback
are written once per batch per settle call, never per child. Wall-clock ratios per round swing from 0.71 to
1.28 on this host, more than that difference: the batch's median meets the goal of 0.8, the fan-in's sits just
under it in this run (0.75; 0.89 as a ratio of the two medians), within the noise of a shared two-core host.
Run again at a load average of 10.3 (other test suites on the host), the per-round ratios spread from 0.58 to 1.65
for the batch (median 0.77) and from 0.54 to 1.33 for the fan-in (median 0.95), while the CPU per child stayed
×1.08 and ×1.06 of a plain job's: the CPU ratio, not the wall-clock one, is the figure to watch here.

**A job outside any workflow** runs two checks because workflows exist: `meta.get("flow")` when it is settled
and `"fed" in meta` when it starts; its settle call carries no workflow section. Timed in turns with the same
loop without them over 100,000 real envelopes' metas: 0.07 µs a job, 0.28 % of the 23.4 µs of worker CPU a plain
job took in the same run (0.44 % at load 10; goal ≤ 2 %).
"""
