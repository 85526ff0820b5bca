"""The error responses every endpoint documents (all share ErrorOut's shape)."""

from api.schemas import ErrorOut

READ = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut}
"""Reads: not authenticated, no view permission, unknown queue or item, bad parameters."""

CHANGE = {**READ, 409: ErrorOut}
"""Changes also answer 409 when they clash with the current state."""
