"""The error responses every endpoint documents (all share ErrorOut's shape)."""

from .schemas import ErrorOut

READ = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut, 429: ErrorOut, 503: ErrorOut}
"""Reads: not authenticated, no view permission, unknown queue or item, bad parameters, too many wrong API keys
(with Retry-After, added to the schema by api.ChasquiAPI), Redis unreachable."""

CHANGE = {**READ, 409: ErrorOut}
"""Changes also answer 409 when they clash with the current state."""

WITH_BODY = {**CHANGE, 400: ErrorOut}
"""Changes that read a JSON body also answer 400 when the body is not JSON at all."""
