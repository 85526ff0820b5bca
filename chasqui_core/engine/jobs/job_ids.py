"""What a job id may be: what every face of Chasqui can address, and nothing that hides what it is.

A caller may choose a job's id (``Queue.add(job_id=...)``, ``.using(job_id=...)``,
the API's enqueue), and the id is then how the job is found again: in a URL
(``/api/jobs/<id>``, the console's job page), on a command line, in a log
line. So an id is refused when some face could never address it, or would
show it as something else:

- ``/``, which ends a URL's path segment even when escaped (the server
  decodes it before routing), and ``.`` or ``..``, which clients remove from
  a path as "this" and "the parent";
- control characters (NUL, newlines, escapes), which cut or rewrite log
  lines and terminals;
- invisible formatting characters (Unicode category Cf: the bidi overrides
  that reorder how text reads, zero-width spaces and joiners, tags), line and
  paragraph separators, and spaces other than the plain space, with which two
  ids look alike and differ;
- more than 200 characters.

The rule is one pattern (``PATTERN``): the API's published schema and every
check here say exactly the same thing.
"""

from __future__ import annotations

import re

MAX_LENGTH = 200

REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Zs"})
"""Control, format (bidi, zero-width, tags), line and paragraph separators, spaces (the plain space is kept)."""

_REFUSED = (
    r"\u0000-\u001f\u002f\u007f-\u00a0\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u1680"
    r"\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u206f\u3000\ufeff\ufff9-\ufffb"
    r"\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    r"\U000e0020-\U000e007f"
)
"""``/`` and every character of REFUSED_CATEGORIES in Unicode 15.0 (Python 3.12's tables), as class ranges
that Python's, Rust's (pydantic) and most other regex engines read alike. Written out rather than computed
from ``unicodedata`` at import, which takes a quarter of a second; a test compares it with the tables of the
running Python."""

_ANY = f"[^{_REFUSED}]"
_NOT_DOT = f"[^.{_REFUSED}]"

PATTERN = (
    f"^(?:{_NOT_DOT}{_ANY}{{0,{MAX_LENGTH - 1}}}"
    f"|\\.{_NOT_DOT}{_ANY}{{0,{MAX_LENGTH - 2}}}"
    f"|\\.\\.{_ANY}{{1,{MAX_LENGTH - 2}}})$"
)
"""A valid id, for schemas: 1 to 200 characters, none refused, and neither "." nor ".."."""

_VALID = re.compile(PATTERN.replace(_REFUSED, _REFUSED + r"\ud800-\udfff"))
"""PATTERN, refusing lone surrogates too (text no UTF-8 encoder takes; a schema's regex engine cannot name them)."""

RULE = (
    f"a job id is 1 to {MAX_LENGTH} characters, without '/', control characters, invisible formatting "
    "(bidi) characters or spaces other than ' ', and is not '.' or '..', so that a URL can address it"
)


def check(job_id: object, name: str = "job_id") -> str:
    """``job_id`` when it is one (see the module's docstring); ValueError in words otherwise."""
    if type(job_id) is not str:
        raise ValueError(f"{name} must be a string: {RULE}; got {type(job_id).__name__}")
    if _VALID.fullmatch(job_id) is None:
        raise ValueError(f"{name} {job_id[:MAX_LENGTH]!r} is not valid: {RULE}")
    return job_id
