"""Workflows as operators see them: a batch or a chain by id, with its counts, children and callbacks."""

from __future__ import annotations

from chasqui_core import access
from chasqui_core.flows import BatchStatus, UnknownBatch, read_status
from chasqui_core.services.common import InvalidInput, NotFound, Source, engine_errors, redis_client, require


def get_batch(actor, batch_id: str, *, source: Source = "api") -> BatchStatus:
    """A batch's or a chain's state now; NotFound when there is none (or it expired), InvalidInput for an id
    that cannot be one. The data is the engine's, unmasked: callers mask what they show."""
    require(actor, access.VIEW, source)
    if not isinstance(batch_id, str) or not batch_id or len(batch_id) > 200:
        raise InvalidInput("batch_id must be a non-empty string of at most 200 characters")
    try:
        with engine_errors:
            return read_status(redis_client(), batch_id)
    except UnknownBatch as exc:
        raise NotFound(str(exc)) from None
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
