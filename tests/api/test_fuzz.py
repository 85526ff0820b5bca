"""Schema-driven fuzzing: every operation of the OpenAPI schema, fed generated input
by an operator (who may call everything), must never answer 5xx, and must answer only
what the schema documents: a listed status code, its content type, a body matching its schema."""

import pytest
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)




from . import helpers
from .conformance import published_schema

_keep_test_connection = helpers.keep_test_connection
operator_key = helpers.seeded_operator_key

pytestmark = pytest.mark.django_db



# Loaded at collection: one generated test per operation of the live schema.
schema = published_schema()
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]



@pytest.mark.serial  # schemathesis's generated tests do not run in pytest-xdist's workers (make test)
@schema.parametrize()
@settings(max_examples=15, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_no_input_makes_the_api_fail(case, operator_key):
    queue = case.path_parameters.get("queue") if case.path_parameters else None
    if queue is not None and len(queue) % 2 == 0:
        case.path_parameters["queue"] = "default"  # half the cases on a queue that exists
    case.call_and_validate(headers={"Authorization": f"Bearer {operator_key}"}, checks=CHECKS)


NASTY = ["\x00", "\ud800", "🙂" * 50, "a" * 5000, "%00", "../../etc", "1-0", "-1", "18446744073709551616-0",
         "9" * 40, "nan", "inf:0", "1e400:0", " ", "*", "[a-", "\\", "default\x00"]


@pytest.mark.parametrize("value", NASTY)
def test_nasty_values_never_cause_a_server_error(op_api, operator_key, value):
    from urllib.parse import quote

    v = quote(value.encode("utf-8", "surrogatepass"), safe="")
    gets = [
        f"/api/queues/{v}", f"/api/queues/default/dlq/{v}", f"/api/queues/default/delayed/{v}",
        f"/api/jobs/{v}", f"/api/operations/{v}",
    ]
    for path in gets:
        assert op_api.client.get(path).status_code < 500, path
    queries = [("/api/queues/default/dlq", n) for n in ("task", "reason", "error_class", "error_text", "since",
                                                         "until", "cursor", "limit")]
    queries += [("/api/queues/default/dlq/groups", n) for n in ("task", "error_text", "since")]
    queries += [("/api/queues/default/delayed", n) for n in ("cursor", "limit")]
    queries += [("/api/audit", n) for n in ("action", "queue", "actor", "source", "cursor", "since")]
    queries += [("/api/workers", "queue"), ("/api/workers", "stale_after_ms"), ("/api/operations", "queue"),
                ("/api/queues/default/metrics", "window"), ("/api/queues/default/metrics", "resolution")]
    for path, name in queries:
        r = op_api.client.get(f"{path}?{name}={v}")
        assert r.status_code < 500, (path, name, r.content)
    bodies = [
        ("/api/queues/default/jobs", {"task": value, "args": [value], "kwargs": {value: value}}),
        ("/api/queues/default/jobs", {"task": "tests.django.sample_tasks.add", "args": [value, 10 ** 30],
                                      "job_id": value, "backoff": value}),
        ("/api/queues/default/dlq/replay", {"ids": [value]}),
        ("/api/queues/default/dlq/replay", {"filter": {"task": value, "error_text": value}, "run_at": value}),
        ("/api/queues/default/dlq/discard", {"filter": {"error_class": value}}),
        (f"/api/queues/default/dlq/{v}/replay", {"run_at": "9999-12-31T23:59:59Z"}),
        (f"/api/queues/default/delayed/{v}/cancel", None),
        (f"/api/queues/default/delayed/{v}/run-now", None),
        (f"/api/operations/{v}/cancel", None),
    ]
    for path, body in bodies:
        r = op_api.client.post(path, data=_dumps(body), content_type="application/json")
        assert r.status_code < 500, (path, body, r.content)


def _dumps(body) -> str:
    import json

    return json.dumps(body) if body is not None else ""
