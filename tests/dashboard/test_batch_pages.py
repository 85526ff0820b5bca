"""A workflow's page in the console, and the link to it from its jobs' pages, through Django's test client."""

from __future__ import annotations

import msgpack
import pytest
from django.test import Client

from chasqui_core.engine.flows import batches
from chasqui_core.engine.flows.compose import BatchSpec, start_batch
from chasqui_core.engine.producer.queue import JobSpec, Queue
from chasqui_core.engine.settle.settler import _Batch, settle_call
from chasqui_core.engine.store.keys import GROUP
from chasqui_core.engine.store.scripts import Scripts
from tests.helpers import TASK

pytestmark = pytest.mark.django_db

Q = "emails"


def _client(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _finish_first(redis, q: Queue, started, result: bytes) -> None:
    """Settle the batch's first child as a worker would, with its return value (msgpack)."""
    redis.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    [(_, [(entry_id, _)])] = redis.xreadgroup(GROUP, "w", {q.keys.stream: ">"}, count=1)
    b = _Batch(done=[entry_id], completed=[[started.job_ids[0], TASK, 1]],
               flow_ends=[entry_id, started.id, started.job_ids[0], "ok", result])
    Scripts(redis).settle(**settle_call(q.keys, "w", b))


def test_a_batch_page_shows_progress_callbacks_and_children_escaped(viewer, redis):
    q = Queue(Q, redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec(TASK, [1, 2]), JobSpec(TASK, [3, 4])],
                                       on_success=JobSpec(TASK, [0, 0])))
    _finish_first(redis, q, started, msgpack.packb("<script>x</script>"))
    page = _client(viewer).get(f"/batches/{started.id}/").content.decode()
    assert 'data-state="running"' in page and "50%" in page
    assert 'data-succeeded>1<' in page and 'data-total>2<' in page
    success = batches.read(redis, started.id).callbacks["success"].job_id
    assert f'href="/jobs/{success}/"' in page and "not yet" in page
    assert all(f'data-child="{j}"' in page for j in started.job_ids)
    assert "<script>x</script>" not in page and "&lt;script&gt;" in page


def test_a_job_page_links_to_its_batch(viewer, redis):
    q = Queue(Q, redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec(TASK, [1, 2])]))
    page = _client(viewer).get(f"/jobs/{started.job_ids[0]}/").content.decode()
    assert f'href="/batches/{started.id}/"' in page


def test_batch_pages_need_a_login_the_permission_and_a_known_id(client, outsider, viewer, redis):
    q = Queue(Q, redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec(TASK, [1, 2])]))
    assert client.get(f"/batches/{started.id}/").status_code == 302
    assert _client(outsider).get(f"/batches/{started.id}/").status_code == 403
    response = _client(viewer).get(f"/batches/{Q}:01ARZ3NDEKTSV4RRFFQ69G5FAV/")
    assert response.status_code == 404 and "never existed" in response.content.decode()


def test_the_cancel_button_shows_to_those_who_may_cancel_and_cancels_the_pending_children(viewer, operator, redis):
    q = Queue(Q, redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec(TASK, [1, 2]), JobSpec(TASK, [3, 4])]))
    assert 'data-action="cancel-batch"' not in _client(viewer).get(f"/batches/{started.id}/").content.decode()
    assert 'data-action="cancel-batch"' in _client(operator).get(f"/batches/{started.id}/").content.decode()
    assert _client(viewer).post(f"/batches/{started.id}/cancel/").status_code == 403
    assert redis.hlen(q.keys.cancel) == 0
    response = _client(operator).post(f"/batches/{started.id}/cancel/")
    assert response.status_code == 302 and response["Location"] == f"/batches/{started.id}/"
    assert {j.decode() for j in redis.hkeys(q.keys.cancel)} == set(started.job_ids)


def test_the_replay_button_replays_every_dead_child_and_says_how_many(viewer, operator, redis, redis_url):
    from chasqui_core.models import AuditEntry
    from tests.engine.test_flows import registry
    from tests.engine.worker_app import wait_for
    from tests.helpers import worker_running

    q = Queue(Q, redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec("square", [3]), JobSpec("fail"), JobSpec("fail")],
                                       on_success=JobSpec("echo", ["ok"])))
    with worker_running(redis_url, [Q], registry(redis)):
        wait_for(lambda: batches.read(redis, started.id).ended == 3, 30, "every child ended")
        page = _client(viewer).get(f"/batches/{started.id}/").content.decode()
        assert 'data-action="replay-dead"' not in page, "a viewer may not replay"
        page = _client(operator).get(f"/batches/{started.id}/").content.decode()
        assert 'data-action="replay-dead"' in page and "Replay 2 dead" in page
        assert _client(viewer).post(f"/batches/{started.id}/replay-dead/").status_code == 403
        assert redis.xlen(q.keys.dlq) == 2
        redis.set("fixed", 1)
        response = _client(operator).post(f"/batches/{started.id}/replay-dead/", follow=True)
        assert "2 jobs of" in response.content.decode() and "replayed" in response.content.decode()
        wait_for(lambda: batches.read(redis, started.id).status == "succeeded", 30, "the replays succeeded")
    state = batches.read(redis, started.id)
    assert state.callbacks["success"].fired and state.results == [9, "fixed", "fixed"]
    assert AuditEntry.objects.get(action="replay").count == 2
    page = _client(operator).get(f"/batches/{started.id}/").content.decode()
    assert 'data-action="replay-dead"' not in page, "nothing dead is left to replay"


def test_a_fired_callbacks_job_page_links_to_its_batch(viewer, redis):
    q = Queue(Q, redis_client=redis)
    started = start_batch(q, BatchSpec([JobSpec(TASK, [1, 2])], on_complete=JobSpec(TASK, [0, 0])))
    _finish_first(redis, q, started, msgpack.packb(3))
    complete = batches.read(redis, started.id).callbacks["complete"]
    assert complete.fired
    page = _client(viewer).get(f"/jobs/{complete.job_id}/").content.decode()
    assert f'href="/batches/{started.id}/"' in page
