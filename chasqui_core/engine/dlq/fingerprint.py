"""Error fingerprints: one text for failures that share a cause.

"User 123 not found" and "user 456 not found" are one problem to an
operator, so the console groups dead jobs by a fingerprint that replaces the
variable parts of a message (ids, numbers, quoted values) with placeholders.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

from chasqui_core.engine.jobs.redact import mask_text

_NORMALISERS = (
    (re.compile(r"""(?<!\w)'[^'\n]*'(?!\w)|(?<!\w)"[^"\n]*"(?!\w)|`[^`\n]*`"""), "<str>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b"), "<id>"),  # ULIDs, as used for job ids
    (re.compile(r"\b0[xX][0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{6,}\b"), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
)
_FINGERPRINT_TEXT = 200


def fingerprint(error_class: str, message: str) -> str:
    """Error class plus the message with its variable parts replaced.

    Failures that differ only in ids, numbers or quoted values ("user 123 not
    found", "user 456 not found") share a fingerprint, so one group shows
    one cause. Long messages are cut, with a digest of the whole normalised
    text appended so that two long messages differing at the end stay apart.
    """
    text = mask_text(message)  # before normalising: "password=x9TopSecret" must not leave "TopSecret"
    for pattern, placeholder in _NORMALISERS:
        text = pattern.sub(placeholder, text)
    text = text.strip()
    if len(text) > _FINGERPRINT_TEXT:
        digest = hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
        text = f"{text[:_FINGERPRINT_TEXT]}…#{digest}"
    if error_class and text:
        return f"{error_class}: {text}"
    return error_class or text


def fingerprint_id(fingerprint_text: str) -> str:
    """A short, stable id for a fingerprint: what URLs and filters carry instead of its text."""
    return hashlib.blake2b(fingerprint_text.encode(), digest_size=8).hexdigest()


INVALID_RETRY_FINGERPRINT = fingerprint("InvalidRetry", "the retry delay is not a usable number of milliseconds")
"""The fingerprint of a retry ``settle.lua`` could not schedule: it dead-letters the job itself, in Lua,
where the normalisers above do not run, so this one is computed here and written into the script."""


@lru_cache(maxsize=4096)
def error_group(error_class: str, message: str) -> tuple[str, str]:
    """The fingerprint id and text of a failure, as the worker writes them with each dead-letter entry.

    Remembered, since a failing job usually fails as its neighbours did: a burst
    of one error costs the normalisers once per distinct message.
    """
    text = fingerprint(error_class, message)
    return fingerprint_id(text), text
