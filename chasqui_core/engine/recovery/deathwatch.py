"""Deaths seen from beside: a worker whose process is gone, recorded by a live worker that shares its process table.

A lost run is charged as a death only when the worker's death is on record
(reclaim.py), and a record is written by whoever saw the process end: its
supervisor when a child exits, or the worker itself as it stops. A child whose
supervisor was killed has nobody left to see it end. It stops by itself, and
records its end as it begins to stop, but a crash in the instant before (a
task that calls ``os._exit`` while the news of the supervisor's death is on
its way) leaves no record, and its runs would be reclaimed as lost contact:
a poison pill could then kill worker after worker without reaching ``panic``.

So every worker also looks, just before it reclaims a queue's streams, at
the heartbeats of that queue's workers that run in its own *process space*
(the same kernel boot and pid namespace, ``process_space``): a process table
is the truth about who lives.
A worker whose pid is gone, a zombie, or now another process (one that
began after the worker did) is dead, and its death is put on record, unless
one is there already. Workers elsewhere are never judged: a worker on another
host that stopped answering may be alive, and its runs stay lost contact
unless its own supervisor records its death.

A process can also end cleanly without a word to Redis: a worker cut off by a
partition as it stops settles nothing and cannot take its heartbeat away. Its
runs all ended; what it could not write is lost contact, not a death. So such
a worker leaves a note on the host as it exits (``note_clean_stop``, a file
named for it in the temporary directory), and a worker with a note is not
recorded dead. Its runs' ends it could not send (ended_runs.py) are struck
from its start journal instead, once its process is gone: a death recorded
as it began to stop (``announce_stop``) must not make a run that returned,
whose outcome it could not settle, a death.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Sequence

import msgpack

from chasqui_core.engine.jobs.envelope import now_ms
from chasqui_core.engine.recovery.reclaim import add_death_record, strike_ended_runs
from chasqui_core.engine.store.connection import Client
from chasqui_core.engine.store.keys import QueueKeys

logger = logging.getLogger("chasqui.worker")

SPACE_FIELD = "space"
"""The heartbeat field naming the worker's process space."""

REUSE_MARGIN_MS = 2000
"""A process that began this long after the worker's heartbeat says the worker began is another process under a
reused pid (the clock that dates processes has a resolution of a second)."""


def process_space() -> str:
    """``<boot id>/<pid namespace>``: two processes with the same one see the same process table, so one can
    tell whether the other lives. "" where the system does not say (then nothing is judged)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{namespace}" if boot and namespace else ""


def _boot_time_ms() -> int:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1]) * 1000
    raise OSError("no btime in /proc/stat")


def process_gone(pid: int, began_ms: int) -> bool:
    """True when the process ``pid`` of this process space, which began by ``began_ms`` (epoch ms), has ended:
    no such pid, a zombie, or a process that began later (the pid was reused). False when in doubt."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2:].split()  # the command name, in parentheses, may hold spaces
    try:
        state, ticks = fields[0], int(fields[19])
        began = _boot_time_ms() + ticks * 1000 // os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return False
    return state in ("Z", "X") or began > began_ms + REUSE_MARGIN_MS


def _stop_note(worker_id: str) -> str:
    return os.path.join(tempfile.gettempdir(), "chasqui-stopped", worker_id.replace(os.sep, "_"))


def note_clean_stop(worker_id: str) -> None:
    """Leave the note that this worker's process stopped cleanly though it could not tell Redis (best effort)."""
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(_stop_note(worker_id)), exist_ok=True)
        with open(_stop_note(worker_id), "w"):
            pass


def stopped_cleanly(worker_id: str) -> bool:
    """The worker's process left the note of a clean stop (``note_clean_stop``)."""
    return os.path.exists(_stop_note(worker_id))


class DeathWatch:
    """One worker's look at its neighbours: records the deaths of workers of its process space whose processes
    are gone without a clean stop (see the module's docstring)."""

    def __init__(self, client: Client, own_id: str, space: str | None = None) -> None:
        self.client = client
        self.own_id = own_id
        self.space = process_space() if space is None else space
        self.recorded: set[tuple[str, str]] = set()
        """(queue, worker) of the deaths this one has recorded already (their heartbeats stay until they are
        forgotten)."""

    async def look(self, queues: Sequence[QueueKeys]) -> list[str]:
        """Record the death of every worker of ``queues`` that ran in this process space and whose process is
        gone; returns their ids. One round trip, and a second only when a death is found."""
        if not self.space:
            return []
        pipe = self.client.pipeline(transaction=False)
        for keys in queues:
            pipe.hgetall(keys.workers)
        found: list[tuple[QueueKeys, str]] = []
        stopped: list[tuple[QueueKeys, str]] = []
        listed: set[tuple[str, str]] = set()
        for keys, beats in zip(queues, await pipe.execute(), strict=True):
            for name, raw in beats.items():
                worker_id = name.decode(errors="replace") if isinstance(name, bytes) else name
                listed.add((keys.queue, worker_id))
                if worker_id == self.own_id or (keys.queue, worker_id) in self.recorded:
                    continue
                try:
                    info = msgpack.unpackb(raw, raw=False)
                    pid, began = int(info["pid"]), int(info["started_at"])
                    same = info.get(SPACE_FIELD) == self.space
                except Exception:
                    continue  # a heartbeat that cannot be read, or one from before process spaces: not judged
                if same and process_gone(pid, began):
                    (stopped if stopped_cleanly(worker_id) else found).append((keys, worker_id))
        looked = {keys.queue for keys in queues}  # forgotten workers leave the workers lists for good
        self.recorded = {seen for seen in self.recorded if seen[0] not in looked or seen in listed}
        if not found and not stopped:
            return []
        pipe = self.client.pipeline(transaction=False)
        for keys, worker_id in stopped:  # no death: only the strikes its process could not send before it stopped
            strike_ended_runs(pipe, keys, worker_id)
        self.recorded.update((keys.queue, worker_id) for keys, worker_id in stopped)
        if not found:
            if len(pipe):
                await pipe.execute()
            return []
        at = now_ms()
        for keys, worker_id in found:
            add_death_record(pipe, keys, worker_id, f"its process {worker_id} is gone (seen by {self.own_id})", at,
                             first_only=True)
        await pipe.execute()
        dead = sorted({worker_id for _, worker_id in found})
        known = {worker_id for _, worker_id in self.recorded}
        self.recorded.update((keys.queue, worker_id) for keys, worker_id in found)
        for worker_id in dead:
            if worker_id in known:  # recorded on another of its queues already, and said so then
                continue
            logger.info("worker %s: worker %s ran beside this one and its process is gone: its death is on record",
                        self.own_id, worker_id)
        return dead
