"""Tracebacks for the error history, cheap enough to take on every failure.

``traceback.format_exception`` on Python 3.11+ re-parses each frame's source
to draw the ``^^^`` markers, which made formatting cost more than the rest of
a failed run. The history needs file, line, function and source line per
frame, and the chain of causes, so that is all this builds.
"""

from __future__ import annotations

import linecache
import traceback
from types import CodeType, TracebackType
from typing import NamedTuple

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"
MAX_FRAMES = 100


def format_exception(exc: BaseException) -> str:
    if exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__):
        return _frames(exc) + _exception_only(exc)  # no chain to walk: most failures
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    link = ""
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, _CONTEXT
        else:
            current = None
    parts: list[str] = []
    # oldest first, as Python prints them; each link is printed before the exception it leads to
    for position, (err, _) in enumerate(reversed(chain)):
        if position:
            parts.append(chain[len(chain) - position][1])
        parts.append(_frames(err))
        parts.append(_exception_only(err))
    return "".join(parts)


def _exception_only(err: BaseException) -> str:
    """The last line(s) of a traceback: ``module.Class: message``, then any notes."""
    if isinstance(err, SyntaxError):  # has its own layout (the offending line and a caret)
        return "".join(traceback.format_exception_only(type(err), err))
    try:
        message = str(err)
    except Exception:
        message = "<exception str() failed>"
    text = _last_line(type(err), message)
    for note in getattr(err, "__notes__", None) or ():
        text += f"{note}\n"
    return text


def _last_line(cls: type[BaseException], message: str) -> str:
    """``module.Class: message`` as Python prints it (no module for builtins and ``__main__``)."""
    name = cls.__qualname__ if cls.__module__ in ("builtins", "__main__") else f"{cls.__module__}.{cls.__qualname__}"
    return f"{name}: {message}\n" if message else f"{name}\n"


_FRAMES_CACHE: dict[tuple[int, ...], tuple[tuple[CodeType, ...], str]] = {}
"""Text of a path through the code, by the path's key (see ``_path``).

Each entry also holds the path's code objects, so none of them can be
freed, and its id reused by other code, while the entry exists.
"""
_FRAMES_CACHE_SIZE = 512


def _frames(err: BaseException) -> str:
    """The frames of a traceback, remembered by their code locations.

    A failing job fails the same way many times (the same handler, the same
    line), so the text of a path through the code is built once.
    """
    tb = err.__traceback__
    if tb is None:
        return ""
    return _frames_on(_path(tb), tb)


def _frames_on(key: tuple[int, ...], tb: TracebackType) -> str:
    """The text of the frames of ``tb``, whose path is ``key``: built once per path."""
    cached = _FRAMES_CACHE.get(key)
    if cached is not None:
        return cached[1]
    lines = ["Traceback (most recent call last):\n"]
    for code, lineno in _code_lines(tb):
        lines.append(f'  File "{code.co_filename}", line {lineno}, in {code.co_name}\n')
        source = linecache.getline(code.co_filename, lineno).strip()
        if source:
            lines.append(f"    {source}\n")
    if key[-1]:
        lines.append("  ...\n")
    text = "".join(lines)
    if len(_FRAMES_CACHE) >= _FRAMES_CACHE_SIZE:
        _FRAMES_CACHE.clear()
        _DESCRIBED.clear()  # its keys hold code ids that only this cache keeps alive
    _FRAMES_CACHE[key] = (_codes(tb), text)
    return text


def _path(tb: TracebackType | None) -> tuple[int, ...]:
    """The key of a traceback's path through the code: each frame's code and instruction, then whether it was cut.

    Made of what is cheap to read: the id of each frame's code object, rather
    than the object (hashing and comparing one goes through its bytecode and
    constants), and the offset of its instruction, rather than ``tb_lineno``
    (worked out from the code's line table on every read, microseconds in a
    long function). A cache keyed by it holds the code objects too (``_codes``).
    """
    key: list[int] = []
    depth = 0
    while tb is not None and depth < MAX_FRAMES:
        key += (id(tb.tb_frame.f_code), tb.tb_lasti)
        tb = tb.tb_next
        depth += 1
    key.append(tb is not None)
    return tuple(key)


def _code_lines(tb: TracebackType | None) -> list[tuple[CodeType, int]]:
    """(code object, line number) of each frame, up to MAX_FRAMES."""
    found: list[tuple[CodeType, int]] = []
    while tb is not None and len(found) < MAX_FRAMES:
        found.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    return found


def _codes(tb: TracebackType | None) -> tuple[CodeType, ...]:
    return tuple(code for code, _ in _code_lines(tb))


class Failure(NamedTuple):
    """An exception as the error history keeps it."""

    error_class: str
    """See ``class_path``."""
    message: str
    """See ``message``."""
    traceback: str
    """``format_exception``, made printable."""


_DESCRIBED: dict[tuple[tuple[int, ...], type, str], Failure] = {}
"""Lone failures already described, by path, class and message.

Every key's path is also in ``_FRAMES_CACHE``, which keeps its code objects
alive; clearing that cache clears this one.
"""
_DESCRIBED_SIZE = 1024
_DESCRIBED_MESSAGE_LIMIT = 2000
"""Longer messages are described every time rather than kept (and a long one rarely repeats)."""


def describe(exc: BaseException) -> Failure:
    """The class, message and traceback of ``exc`` for its job's error history.

    A job that fails usually fails where it failed before, often with the same
    message ("connection refused"), sometimes with one of its own ("order
    1234 not found"). A lone exception (no cause or context to print, no
    notes) is looked up by its path through the code, class and message; one
    not seen yet is built from the remembered text of its path plus its own
    last line. Either way it costs a walk over its frames and a lookup or
    two, whatever its message.
    """
    lone = (exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)
            and not getattr(exc, "__notes__", None) and not isinstance(exc, SyntaxError))
    try:
        text = str(exc) if lone else None
    except Exception:  # described the long way, which copes with it
        text = None
    if text is None:
        return Failure(class_path(exc), message(exc), printable(format_exception(exc)))
    tb = exc.__traceback__
    path = _path(tb) if tb is not None else ()
    seen = (path, type(exc), text)
    failure = _DESCRIBED.get(seen)
    if failure is None:
        frames = "" if tb is None else _frames_on(path, tb)
        failure = Failure(class_path(exc), printable(text), printable(frames + _last_line(type(exc), text)))
        if len(text) <= _DESCRIBED_MESSAGE_LIMIT:
            if len(_DESCRIBED) >= _DESCRIBED_SIZE:
                _DESCRIBED.clear()
            _DESCRIBED[seen] = failure
    return failure


def class_path(exc: BaseException) -> str:
    """The exception's class as the error history names it: ``ValueError``, ``app.errors.Missing``."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def message(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception cannot print itself.

    An exception class whose ``__str__`` raises (formatting an attribute of
    None, say) is a bug in the error, not a reason to lose the job's retries.
    """
    try:
        return printable(str(exc))
    except Exception as failure:
        return f"<{class_path(exc)}: str() raised {class_path(failure)}>"


def printable(text: str) -> str:
    """``text`` safe to encode: lone surrogates (undecodable bytes smuggled into a str) escaped.

    Such a message would make msgpack refuse the whole envelope or batch.
    """
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text
