"""``python -m bench soak``: the accounting soak.

A mixed workload runs for some minutes under ``runworker --processes 2``
while faults are injected (a child killed with SIGKILL, the supervisor
killed and started again, SIGHUP, Redis shut down and restarted with its
append-only file, a queue paused and resumed). Every run of every job is
written to a ledger file kept outside Redis, so that at the end each job can
be accounted for from a witness that the faults cannot reach: enqueued =
succeeded + dead-lettered, no job ran more often than its budget allows,
every dead-letter reason is the one its kind must get, and no job is called
a poison pill (``panic``) that the ledger does not show running at two
process deaths.

One module per concept, in the order they build on each other:

- ``kinds``: the job kinds, their queue, budget and expected end
- ``ledger``: the ledger's records, how they are written and read back
- ``verdict``: the accounting itself, a pure function of what was read
  (tested without any server in tests/bench/test_soak_verdict.py)
- ``verdict_flows``: the workflows' rules (callbacks and chain steps run when
  due, never when not, enqueued once), which ``verdict`` applies
- ``settings``, ``tasks``: the soak's own Django project (settings and tasks app)
- ``server``: its own redis-server with the append-only file on
- ``workers``: the ``runworker`` supervisor it starts, kills and signals
- ``faults``: the fault timelines (with ``--network-faults``, through
  bench/faultproxy.py) and the watcher of worker processes
- ``contention``: the busy processes of ``--contention``
- ``producer``: the workload (its workflows too), DLQ replays, and the drain
- ``record``: the evidence kept with a run, judged again by ``--judge``
- ``run``: the command line and the whole run, start to verdict
"""
