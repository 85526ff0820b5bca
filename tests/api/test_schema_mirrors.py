"""The API's response schemas that mirror an engine dataclass field for field stay its mirror.

api/schemas.py (with dlq_schemas.py and schedule_schemas.py) spells out each response for OpenAPI (types, descriptions,
examples); the engine's dataclasses are what the services hand it. A field
added on one side and not the other would be dropped from the API, or be a
schema field always empty, without any test failing. Each pair below lists
the fields that differ on purpose, and why; any other difference fails here.
"""

from __future__ import annotations

import dataclasses

import pytest

from api import batches, dlq_schemas, schedule_schemas, schemas
from chasqui_core import flows
from chasqui_core.engine.timing import delayed, scheduler
from chasqui_core.engine.ops import history, metrics, running_jobs, stats
from chasqui_core.engine.worker import limits
from chasqui_core.engine.dlq import browse, search

MIRRORS = [
    # (schema, dataclass, {field only in the schema: why}, {field only in the dataclass: why})
    (schemas.QueueStatsOut, stats.QueueStats, {}, {"band_streams": "internal: which streams the figures read"}),
    (schemas.LimitBucketOut, limits.BucketState, {}, {"scope": "the limit's own, given once by LimitOut"}),
    (schemas.DelayedJobOut, delayed.DelayedJob, {"run_at": "due_ms as a date, for people"},
     {"member": "the raw delayed-set member, which the API never hands out"}),
    (schemas.DelayedPageOut, delayed.DelayedPage, {}, {}),
    (dlq_schemas.DLQPageOut, browse.Page, {}, {}),
    (dlq_schemas.ErrorGroupOut, browse.ErrorGroup, {"first_seen": "first_seen_ms as a date",
                                                "last_seen": "last_seen_ms as a date"}, {}),
    (dlq_schemas.DLQSearchOut, search.SearchPage, {}, {}),
    (schemas.WorkerOut, stats.WorkerInfo, {"last_seen": "last_seen_ms as a date"}, {}),
    (schemas.RunningJobOut, running_jobs.RunningJob, {"started_at": "started_at_ms as a date"},
     {"band": "internal: the stream the run was read from", "started_at_ms": "given as started_at"}),
    (schemas.RunningPageOut, running_jobs.RunningPage, {}, {}),
    (schemas.TaskFiguresOut, history.TaskFigures, {}, {}),
    (schedule_schemas.FireOut, scheduler.FireRecord,
     {"fired_at": "at as a date", "outcome": "read from the fire's job"}, {"at": "given as fired_at"}),
    (schemas.MetricsOut, metrics.Series, {"fields": "the counters' names, listed once for the series"}, {}),
    (batches.BatchOut, flows.BatchStatus, {"pending": "BatchStatus.pending, a property"},
     {"states": "each child's state, given in children", "child_results": "each child's result, in children",
      "results": "the same results (a chain's by step), in children"}),
]


@pytest.mark.parametrize(("schema", "record", "schema_only", "record_only"), MIRRORS,
                         ids=[m[0].__name__ for m in MIRRORS])
def test_a_response_schema_keeps_the_fields_of_the_engine_record_it_mirrors(schema, record, schema_only,
                                                                             record_only):
    schema_fields = set(schema.model_fields)
    record_fields = {f.name for f in dataclasses.fields(record)}
    assert schema_fields - record_fields == set(schema_only), (
        f"{schema.__name__} has fields {record.__name__} does not: {sorted(schema_fields - record_fields)}")
    assert record_fields - schema_fields == set(record_only), (
        f"{record.__name__} has fields the API's {schema.__name__} leaves out: {sorted(record_fields - schema_fields)}")
