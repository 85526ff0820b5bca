"""Schema-valid input is never refused: every request the published schema allows is taken by validation.

A client generated from the schema, or a person reading it, trusts that what it allows is accepted; a 400 or
422 for such input means the schema promised more than the API keeps. Requests are generated from the schema
in its positive mode only (values it allows, at their boundaries first), by an operator who may call
everything, against data that exists, so the answers are 2xx or one about the state (404 for an entry that
is not there, 409 for a finished operation), never a refusal of the input's shape, never a server error.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode

from django.core.signals import request_finished, request_started
from django.db import close_old_connections



from . import helpers
from .conformance import SCHEMA_PATH

_keep_test_connection = helpers.keep_test_connection
operator_key = helpers.seeded_operator_key

pytestmark = pytest.mark.django_db

REFUSALS = {400, 422}
"""What the API answers for input it will not take."""

BEYOND_A_SCHEMA = (
    "since_ms",  # since after until: an order between two fields
    # The project's tasks, the arguments each takes and the queues its backend serves: known only at run time.
    "Unknown task",
    "Arguments do not fit task",
    "is not served by the task backend",
)
"""Refusals of rules a JSON Schema cannot state, each recognised by its words; any other refusal fails."""


def _positive_schema():
    from config.wsgi import application

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        loaded = schemathesis.openapi.from_wsgi(SCHEMA_PATH, application)
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    loaded.config.generation.update(modes=[GenerationMode.POSITIVE])
    return loaded


schema = _positive_schema()




@pytest.mark.serial  # schemathesis's generated tests do not run in pytest-xdist's workers (make test)
@schema.parametrize()
@settings(max_examples=20, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_schema_valid_input_is_never_refused(case, operator_key):
    if case.path_parameters and "queue" in case.path_parameters and len(case.path_parameters["queue"]) % 2 == 0:
        case.path_parameters["queue"] = "default"
    response = case.call(headers={"Authorization": f"Bearer {operator_key}"})
    assert response.status_code < 500, (case.method, case.formatted_path, response.text[:500])
    if response.status_code in REFUSALS and any(words in response.text for words in BEYOND_A_SCHEMA):
        return
    assert response.status_code not in REFUSALS, (
        f"{case.method} {case.formatted_path} refused input its schema allows: {response.status_code} "
        f"{response.text[:500]}\nquery={case.query!r} body={case.body!r}")
