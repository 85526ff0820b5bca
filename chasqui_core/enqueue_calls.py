"""The calls of one ``enqueue_many`` batch: each ``(args, kwargs)`` pair checked so a mistake names its index,
and the batch built with garbage collection paused (nothing built forms a cycle, and a collection would
walk every object of the process).
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any


def _count(calls: Iterable[Any]) -> int:
    """How many calls a batch has, when that is known without consuming it (else 0: not said)."""
    try:
        return len(calls)  # type: ignore[arg-type]
    except TypeError:
        return 0


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No garbage collection while a batch's objects are built (its TaskResults while it is sent).

    A thousand TaskResults, each with its lists and dicts, trigger several
    collections that walk every object the process holds (Django's included),
    which cost more than building them; nothing built here forms a cycle.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _unpack_call(index: int, call: Any) -> tuple[Any, Any]:
    """One ``(args, kwargs)`` pair of ``enqueue_many``, checked so a mistake names its index."""
    if type(call) is tuple and len(call) == 2:  # the usual shape, in three exact type checks
        args, kwargs = call
        if (type(args) is tuple or type(args) is list) and type(kwargs) is dict:
            return args, kwargs
    if isinstance(call, (str, bytes)) or not isinstance(call, (tuple, list)) or len(call) != 2:
        raise TypeError(f"call {index}: expected an (args, kwargs) pair, got {call!r:.100}")
    args, kwargs = call
    if isinstance(args, (str, bytes, dict)) or not isinstance(args, (list, tuple)):
        raise TypeError(f"call {index}: args must be a list or tuple, got {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise TypeError(f"call {index}: kwargs must be a dict, got {type(kwargs).__name__}")
    return args, kwargs
