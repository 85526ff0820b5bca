"""The fixed prose of docs/benchmarks.md: how the suite measures and what each scenario is, Markdown sections
that ``report.markdown`` writes after the run's tables (the hand-measured sections are in page_sections.py).

Kept apart from report.py, which turns a run into lines, tables and JSON: these change when the method does,
not when a run's numbers do.
"""

METHOD = """\
## How it measures

- **One command.** `python -m bench --all --markdown docs/benchmarks.md` ran every scenario and wrote this
  page; `python -m bench worker-concurrent latency` runs a selection, `--json out.json` saves the numbers,
  `--repeats N` changes the number of measured repeats, `--smoke` runs tiny sizes once (CI does, to prove the
  suite works; its numbers mean little). `make bench ARGS="..."` does the same.
- **Server.** By default a private Valkey server started for the run, append-only file **off** (benchmarks
  measure the queue, not the disk; the development server keeps it on). With `REDIS_URL` set, that server is
  used; it must be an empty database, since every scenario starts with `FLUSHDB` (or pass `--flush`).
- **Empty start, warm-up, median.** Every scenario empties the database, runs a warm-up that is not
  counted, then measures. A rate is the jobs of the measured window divided by that window's seconds, never
  warm-up plus measured jobs over the measured time. The table shows the median of the repeats.
- **Redis ceiling.** In the same run, the rate of bare pipelined `XADD`s (pre-encoded, pipelines of 1,000, one
  connection) of a job-sized entry. Every job costs the server at least one stream write, so no client on this
  machine can beat it; each rate is also shown as a fraction of it, which travels better between machines.
- **Workers.** The engine's real `Worker`, every feature on: retries with backoff, events and counters,
  heartbeats, lease renewal, crash recovery, the promoter. The backlog is loaded before the worker process
  starts; the window opens when the first handler starts and closes when the last job's outcome is
  acknowledged in Redis. After each drain the worker is stopped cleanly and the queue is checked: nothing may
  be left in the stream, the pending list, the delayed set or the DLQ.
- **The Django path.** The same work as a Django user does it, in the same run, each row next to the engine
  row it mirrors (its *engine twin*, same handler kind, concurrency and backlog size): `django-enqueue` is
  `queue-add` through `@task(...).enqueue()` (measured in turns with a `Queue.add` loop, a block of 1,000
  calls each, so that both see the same machine: its twin is that loop's row), `django-enqueue-many` is
  `queue-add-bulk` through `task.enqueue_many()` (in turns with `Queue.add_bulk`, a chunk of 1,000 each; its
  twin is that row), and the `runworker-*` rows are the worker rows run by the real
  `python manage.py runworker <queue> --concurrency N`, a fresh process per drain, each drain taking turns
  with a drain of its engine twin by one engine worker process (the twin's row is `<twin> (beside <scenario>)`),
  on the bench's settings
  (`bench/django_settings.py`: the project's settings plus the bench's tasks app, `bench/tasks.py`; DEBUG off,
  the project's own logging, every Django signal receiver running). Django's start-up is
  not throughput: the window opens when the first task starts (it writes the time to Redis) and closes when
  the last job's outcome is acknowledged in Redis; the process is then stopped with SIGTERM and must exit
  cleanly, and the queue is checked as for the engine rows. The worker's CPU time per job is given too.
- **Latency.** Producer and worker in separate processes. The producer stamps `time.time_ns()` into each job
  right before adding it, at a steady rate; the handler subtracts it from its own clock when it starts. Rates:
  500 jobs/s, and half of saturation: the rate at which the worker starts jobs while the producer adds them
  as fast as it can (measured first, with the same two processes, so it is what this pair sustains on this
  machine).
- **Peers.** RQ and arq on the same server in the same run, with settings in their favour (results not kept,
  per-job logging off, arq polling every 10 ms instead of 500 ms). Install them with
  `pip install --no-deps -r requirements-bench.txt` (arq 0.28.0 declares `redis<6` but runs on the project's
  redis-py; `--no-deps` keeps pip from downgrading it). "Chasqui ×N" is Chasqui's median divided by the peer's.
- **Profiling.** `python -m bench worker-concurrent --profile DIR` samples every worker process (the
  `runworker` ones included, start-up and all) with py-spy into `DIR/*.speedscope.json` (open them at
  speedscope.app); a profiled run's numbers are not representative. Worker rows also give the worker
  process's CPU time per job, which varies far less than wall-clock rates on a shared machine.
- **Goals are tracked here, never asserted**: a slow or busy machine must not fail a build. A goal given as a
  rate is also set against the most its scenario could reach in the same run, where another row bounds it
  (`bench/scenarios.py`, `Limit`): a retried job runs twice, so worker-retry cannot pass half of the noop
  drain beside it; the promoter writes each job with an `XADD`, so it cannot pass the ceiling; a Django-path
  row runs its engine twin's code and more. The page says which goals were out of reach in the run.
"""



SCENARIOS = """\
## Scenarios

| Scenario | What it measures |
|---|---|
| `queue-add` | `Queue.add`, one job per call, sync client; in turns with a bare round trip (an `XADD` of a job like `Queue.add`'s, over the same kind of connection), a block of 1,000 calls each: its yardstick `bare XADD round trip (beside queue-add)` |
| `queue-add-bulk` | `Queue.add_bulk` in chunks of 1,000, building the `JobSpec`s included |
| `queue-add-delayed` | `Queue.add(delay=...)`, one job per call |
| `django-enqueue` | Django `@task(...).enqueue()` in a loop, one job per call, and the time of one call; in turns with `Queue.add`, a block of 1,000 calls each: engine twin `queue-add (beside django-enqueue)` |
| `django-enqueue-many` | Django `task.enqueue_many(calls)`, 1,000 `(args, kwargs)` calls per call, building the list included; in turns with `Queue.add_bulk`, a chunk of 1,000 each: engine twin `queue-add-bulk (beside django-enqueue-many)` |
| `worker-generic` | one worker, concurrency 1, async noop handler |
| `worker-concurrent` | one worker process, concurrency 100, async noop handler |
| `worker-sync` | one worker process, concurrency 10, sync (`def`) noop handler run in threads |
| `worker-retry` | every job fails once, is retried after 1 ms, then succeeds; successes per second; in turns with a `worker-concurrent` drain of the same size by the same worker process: shown against `worker-concurrent (beside worker-retry)` |
| `worker-delayed-e2e` | a backlog preloaded in the delayed set, all due: promoted and consumed; in turns with a `worker-concurrent` drain of the same size: shown against `worker-concurrent (beside worker-delayed-e2e)` |
| `runworker-async` | `python manage.py runworker bench-django --concurrency 100`, async noop task; drain by drain in turns with an engine worker process draining the same backlog: engine twin `worker-concurrent (beside runworker-async)` |
| `runworker-sync` | `python manage.py runworker bench-django --concurrency 10`, sync (`def`) noop task run in threads; drain by drain in turns with an engine worker process draining the same backlog: engine twin `worker-sync (beside runworker-sync)` |
| `runworker-sync-100` | `python manage.py runworker bench-django --concurrency 100`, sync (`def`) noop task run in 100 threads; drain by drain in turns with an engine worker process draining the same backlog with an async noop handler: `worker-concurrent (beside runworker-sync-100)`, the engine drain a sync project is measured against |
| `runworker-retry` | `python manage.py runworker bench-django --concurrency 100`, every job fails once, is retried after 1 ms, then succeeds; successes per second; drain by drain in turns with an engine worker process draining the same backlog: engine twin `worker-retry (beside runworker-retry)` |
| `runworker-signed` | `runworker-async` with `CHASQUI["SIGNING_KEYS"]` set: the backlog signed at enqueue, every job's signature checked by the worker; shown against `runworker-async` of the same run |
| `flows` | one worker process, concurrency 100, async noop handler, draining in turns 10,000 plain noop jobs, a batch of 10,000 noop children with an `on_success` callback, and a fan-in chain (that batch, then a step fed its 10,000 results): the workflows shown against `flows: plain drain (beside the workflows)`; and the cost of the workflow checks to a job outside any workflow, timed in turns with the same loop without them |
| `cluster-drain` | one worker process, concurrency 100, async noop handler, draining 3 queues: on one server, then on a 3-master cluster with one queue per master (both started for the scenario from the same Valkey binary) |
| `promoter` | a delayed set of due jobs drained into the stream by the `Promoter` alone (no worker reading) |
| `latency` | enqueue → handler start, p50 / p99 / p99.9, at 500 jobs/s and at half of saturation |
| `memory` | peak RSS (`VmHWM`, else `ru_maxrss`) of a fresh worker process draining the backlog; alone and with Django set up |
| `dlq-page` | `DeadLetters.page(limit=50)`, the console's DLQ page, on 200,000 and 1,000,000 dead jobs (written by plain XADDs, then indexed as after an upgrade) |
| `console-scale` | the console's DLQ reads on a DLQ built by a worker (a real one for the first 2,000 dead jobs, then `settle.lua` as the settler calls it), `--console-size N` entries (default 1,000,000): the grouped view, a first page of rare filters (task, error class, group, reason, task and reason), filtered counts, and finding a job by id when dead, delayed, waiting and finished (beside 1,000,000 delayed and 100,000 waiting jobs); each row beside issue 29's goal |
| `peers` | RQ and arq, `worker-concurrent`-like and `queue-add-bulk`-like, on the same server |

`python -m bench soak` is not a benchmark but the accounting soak ([reliability.md](reliability.md#all-of-it-at-once-the-accounting-soak)):
a mixed workload under injected faults, every job accounted for at the end. It prints its seed first (drawn
for each run unless `--seed` is given). `--contention N` runs it beside N busy processes, as on a loaded host;
`--network-faults` puts its workers behind the project's TCP fault proxy (`bench/faultproxy.py`: latency,
blackholes and refused connections past the visibility timeout, resets, half-open links). Timing goals are
not its business: it exits 1 on any job it cannot account for.
"""
