"""The runs a worker process ended lately, kept on its host where they survive the process: the start journal's
local half.

The start journal (journal.py) marks a run in Redis when it starts and
strikes the mark the moment it ends, so that a process killed between a run's
end and its settle is not charged a run that had returned. The strike is a
write over the network: a link that went half-open or a partition swallows it
without a word, and when the process dies a moment later, the run is charged
a death it did not cause (the soak found it under network faults).

So each strike is also written here first, in a file of the worker's own in
the host's temporary directory, mapped into memory: a slot write, with no
system call, that the kernel keeps when the process dies. Whoever records the
process's death (its supervisor, or a worker beside it: recovery.deathwatch,
both through ``reclaim.add_death_record``) reads the file and strikes those
marks again in the same pipeline, just before the death record: the reclaim
then finds a run that ended unmarked, whatever became of the network write.

The file is a ring of the last ``SLOTS`` ends, far more than a worker has
runs under way, after a table of the journal keys (a run's key is a one-byte
index). A slot is one copy of 64 bytes; one torn by a kill in mid-copy names
at worst a wrong entry id, and striking a mark that is not there is harmless.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import struct
import tempfile
import time

SLOTS = 2048
SLOT_SIZE = 64
"""One byte of key index + 1 (0: empty), one of id length, the stream entry id (at most 41 bytes)."""
NAMES = 255
NAME_SIZE = 160
"""One byte of length, then the journal key's name."""
SIZE = NAMES * NAME_SIZE + SLOTS * SLOT_SIZE

_RING = SLOTS - 1  # SLOTS is a power of two
_SLOT_AT = [NAMES * NAME_SIZE + slot * SLOT_SIZE for slot in range(SLOTS)]
_pack_slot = struct.Struct(f"<BB{SLOT_SIZE - 2}s").pack_into
"""One slot in one copy: a third of the cost of writing its fields one by one."""
STALE_AFTER_S = 24 * 3600
"""A file left this long by a process that is gone (nobody recorded its death) is removed by the next worker to
start on the host."""


def directory() -> str:
    return os.path.join(tempfile.gettempdir(), "chasqui-ended")


def path_of(worker_id: str) -> str:
    return os.path.join(directory(), worker_id.replace(os.sep, "_"))


class EndedRuns:
    """This process's ring of ended runs (see the module's docstring)."""

    def __init__(self, worker_id: str) -> None:
        self.path = path_of(worker_id)
        os.makedirs(directory(), exist_ok=True)
        _sweep_stale()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map: mmap.mmap | bytearray = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._names: dict[str, int] = {}
        self._next = itertools.count().__next__
        """Atomic under the GIL: each writer, a sync thread or the loop, gets a slot of its own."""

    def name(self, key: str) -> int:
        """The index of journal key ``key`` in the file's table, added on first use."""
        index = self._names.get(key)
        if index is None:
            raw = key.encode()
            if len(self._names) >= NAMES or len(raw) >= NAME_SIZE:
                return -1  # never expected: such a run's end is only struck over the network
            index = len(self._names)
            at = index * NAME_SIZE
            self._map[at + 1:at + 1 + len(raw)] = raw
            self._map[at] = len(raw)
            self._names[key] = index
        return index

    def ended(self, index: int, entry_id: bytes) -> None:
        """Note that the run of ``entry_id``, marked in journal key ``index``, has ended."""
        if index >= 0:  # an id longer than a slot (never: stream ids have 41 bytes at most) is ignored when read
            _pack_slot(self._map, _SLOT_AT[self._next() & _RING], index + 1, len(entry_id), entry_id)

    def close(self, *, keep: bool = False) -> None:
        """The process stops. On a clean stop every end reached Redis, so the file goes; ``keep``: the process
        leaves entries pending (outcomes it could not settle, runs it could not finish), which a worker beside
        it will record dead and reclaim: the file stays for that recorder (a strike swallowed by a partition may
        reach Redis only after the stop's own record). A thread still running (an abandoned sync run) may note
        its end later: it goes to memory."""
        mapped, self._map = self._map, bytearray(SIZE)
        if isinstance(mapped, mmap.mmap):
            with contextlib.suppress(OSError, ValueError, BufferError):
                mapped.close()
        if not keep:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def ended_runs_of(worker_id: str) -> EndedRuns | None:
    """This worker's file, or None where the host gives none (its ends then only go over the network)."""
    try:
        return EndedRuns(worker_id)
    except (OSError, ValueError):
        return None


def read(worker_id: str) -> dict[str, list[bytes]]:
    """The ends a worker of this host noted, by journal key: {} when it left no file."""
    try:
        with open(path_of(worker_id), "rb") as f:
            data = f.read(SIZE)
    except OSError:
        return {}
    if len(data) < SIZE:
        return {}
    names = []
    for index in range(NAMES):
        at = index * NAME_SIZE
        length = data[at]
        if not length:
            break
        names.append(data[at + 1:at + 1 + length].decode(errors="replace"))
    ended: dict[str, list[bytes]] = {}
    base = NAMES * NAME_SIZE
    for slot in range(SLOTS):
        at = base + slot * SLOT_SIZE
        index, length = data[at] - 1, data[at + 1]
        if 0 <= index < len(names) and 0 < length <= SLOT_SIZE - 2:
            ended.setdefault(names[index], []).append(data[at + 2:at + 2 + length])
    return ended


def _sweep_stale() -> None:
    """Remove the files of gone processes (worker ids are ``<host>:<pid>:<suffix>``) older than a day."""
    cutoff = time.time() - STALE_AFTER_S
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory()):
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int(entry.name.rsplit(":", 2)[-2])
                if entry.stat().st_mtime < cutoff and not os.path.exists(f"/proc/{pid}"):
                    os.unlink(entry.path)
