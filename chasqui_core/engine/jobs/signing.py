"""Signed jobs: an HMAC-SHA256 that lets a worker trust what it is asked to run.

The threat is someone who can write to Redis (a leaked password, an exposed
port, a compromised neighbour on a shared server) but does not hold the key:
without signatures they could add a job naming any registered task with any
arguments. A producer holding the key signs each job; a worker given keys
refuses (dead-letters as ``bad_signature``) every job whose signature is
missing or matches none of them, before it looks the task up.

*What is signed*: the msgpack array ``[id, task, args, kwargs, created_at,
idempotency key or None]``, the fields a producer sets once and nothing later
changes. Retries (attempt, error history, deaths), replays (replays, a fresh
budget: max_attempts) and meta are left out, so a retried or replayed job
keeps a valid signature without anyone re-signing it, and re-signing is never
needed anywhere but at the producer. The idempotency key is in, so it cannot be
stripped from a genuine job to make a copy of it run again. The queue name is
not: a worker runs the same registered tasks whatever queue a job came from,
so moving a genuine job gains an attacker nothing, and including it would
refuse jobs moved between queues on purpose.

*Where it lives*: in the envelope's ``meta`` map, under ``"signature"``, as 64
hex characters. The envelope stays version 1: a worker without keys (an older
release, or this one before keys are set) runs signed jobs as it always did,
and every path that copies an envelope (retry, replay, requeue, reclaim,
promote) carries meta untouched. A new positional field would have made older
workers refuse every new job during a rolling upgrade.

*Cost*: this runs once per job in the worker. The key's inner and outer
states are computed once (RFC 2104, section 4) and copied per job, which is
half what ``hmac.digest`` costs here; the result is the same HMAC-SHA256
(tests/engine/test_signing.py checks it against ``hmac``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

import msgpack

from chasqui_core.engine.jobs.envelope import Job
from chasqui_core.engine.jobs.idempotency import IDEMPOTENCY_KEY

SIGNATURE = "signature"
"""The key of the signature in a job's ``meta``."""

_BLOCK = 64
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))
_pack = msgpack.Packer(use_bin_type=True).pack
_compare = hmac.compare_digest


def check_keys(keys: Any, where: str = "signing_keys") -> tuple[bytes, ...]:
    """The keys as bytes, in order; raise ValueError naming ``where`` and the bad item."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        raise ValueError(f"{where} must be a list of keys (strings or bytes), the signing key first, "
                         f"e.g. ['current-key', 'older-key']; got {type(keys).__name__}")
    out: list[bytes] = []
    for i, key in enumerate(keys):
        if isinstance(key, str):
            key = key.encode()
        if not isinstance(key, bytes):
            raise ValueError(f"{where}[{i}] must be a string or bytes, got {type(key).__name__}")
        if not key:
            raise ValueError(f"{where}[{i}] is empty: a signing key must hold at least one byte "
                             "(use 32 random bytes or more, e.g. secrets.token_urlsafe(32))")
        out.append(key)
    return tuple(out)


def _states(key: bytes) -> tuple[Any, Any]:
    """The key's inner and outer SHA-256 states, each having hashed its padded block (RFC 2104)."""
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return hashlib.sha256(key.translate(_IPAD)), hashlib.sha256(key.translate(_OPAD))


def signed_message(job_id: str, task: str, args: Any, kwargs: Any, created_at: int,
                   idempotency_key: Any = None) -> bytes:
    """The bytes a signature covers; a worker rebuilds them from the decoded job."""
    message: bytes = _pack([job_id, task, args, kwargs, created_at, idempotency_key])
    return message


class Signer:
    """Signs with the first key; accepts a signature made with any of them (key rotation)."""

    def __init__(self, keys: Sequence[bytes | str], *, where: str = "signing_keys") -> None:
        self.keys = check_keys(keys, where)
        if not self.keys:
            raise ValueError(f"{where} is empty: give at least one key, or no Signer at all")
        self._states = [_states(key) for key in self.keys]
        self._copy_inner, self._copy_outer = self._states[0][0].copy, self._states[0][1].copy

    def __len__(self) -> int:
        return len(self.keys)

    def sign(self, job_id: str, task: str, args: Any, kwargs: Any, created_at: int,
             idempotency_key: Any = None) -> str:
        """The signature of a new job, with the first key, in hex."""
        inner, outer = self._states[0]
        i = inner.copy()
        i.update(signed_message(job_id, task, args, kwargs, created_at, idempotency_key))
        o = outer.copy()
        o.update(i.digest())
        digest: str = o.hexdigest()
        return digest

    def verify(self, job: Job) -> bool:
        """Whether the job carries a signature made with one of the keys over its signed fields.

        Runs once per delivered job: the first key (the one producers sign
        with) is tried inline, the others only when it does not match.
        """
        meta = job.meta
        message = _pack([job.id, job.task, job.args, job.kwargs, job.created_at, meta.get(IDEMPOTENCY_KEY)])
        i = self._copy_inner()
        i.update(message)
        o = self._copy_outer()
        o.update(i.digest())
        try:
            if _compare(o.hexdigest(), meta.get(SIGNATURE)):
                return True
        except TypeError:  # no signature, or not ASCII text (compare_digest refuses it): nothing can match
            return False
        for inner, outer in self._states[1:]:
            i = inner.copy()
            i.update(message)
            o = outer.copy()
            o.update(i.digest())
            if _compare(o.hexdigest(), meta[SIGNATURE]):
                return True
        return False

    def refusal(self, job: Job) -> str:
        """Why ``verify`` refused the job, in words, for its dead-letter entry (only on the rare bad job)."""
        signature = job.meta.get(SIGNATURE)
        if signature is None:
            return "the job carries no signature, and this worker runs signed jobs only"
        if type(signature) is not str or len(signature) != 64 or not signature.isascii():
            return "the job's signature is not 64 hex characters"
        try:
            bytes.fromhex(signature)
        except ValueError:
            return "the job's signature is not 64 hex characters"
        keys = "the signing key" if len(self.keys) == 1 else f"any of the {len(self.keys)} signing keys"
        return (f"the job's signature does not match its task, arguments, id and creation time under {keys} "
                "this worker accepts: it was altered, or signed with a key no longer listed")
