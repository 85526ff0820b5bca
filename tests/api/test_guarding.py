"""Guessing is slowed, permission comes before anything else, and every error is JSON."""

import pytest
from django.test import Client

from .helpers import ApiClient

Q = "default"


def test_wrong_api_keys_from_one_address_get_429_with_retry_after(db, view_api, settings):
    settings.API_KEY_FAILURE_LIMIT = 20
    guesser = ApiClient("not-a-key")
    answers = [guesser.get("/api/queues").status_code for _ in range(60)]
    assert answers[:20] == [401] * 20 and set(answers[20:]) == {429}
    blocked = guesser.get("/api/queues")
    assert blocked.status_code == 429 and blocked.json()["detail"].startswith("Too many requests with a wrong API key")
    assert 0 < int(blocked["Retry-After"]) <= settings.API_KEY_FAILURE_WINDOW
    # the limit is per address: a right key from elsewhere is served as usual
    elsewhere = view_api.client.get("/api/queues", REMOTE_ADDR="10.1.2.3")
    assert elsewhere.status_code == 200


def test_a_user_without_the_permission_gets_403_before_any_validation(outsider_api, redis):
    bad_body = outsider_api.post(f"/api/queues/{Q}/dlq/replay", {"ids": "not a list", "nonsense": True})
    assert bad_body.status_code == 403 and "replay_jobs" in bad_body.json()["detail"]
    unknown = outsider_api.get(f"/api/queues/{Q}/dlq/1-0")
    assert unknown.status_code == 403
    bad_queue = outsider_api.get("/api/queues/no such queue!/dlq")
    assert bad_queue.status_code == 403


def test_an_oversize_body_gets_a_json_413(op_api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = op_api.client.post(f"/api/queues/{Q}/jobs", data="{" + " " * 5000 + "}",
                                  content_type="application/json")
    assert response.status_code == 413
    assert response["Content-Type"].startswith("application/json")
    assert "at most 1000 bytes" in response.json()["detail"]


def test_unknown_api_paths_and_methods_answer_json(view_api):
    missing = view_api.get("/api/no-such-endpoint")
    assert missing.status_code == 404 and missing.json()["detail"].startswith("No such API endpoint")
    wrong_method = view_api.client.delete("/api/queues")
    assert wrong_method.status_code == 405 and "detail" in wrong_method.json()


@pytest.mark.django_db
def test_thirty_wrong_passwords_lock_the_login_out_with_a_clear_message(django_user_model):
    django_user_model.objects.create_user("olga", password="the-right-one")
    browser = Client()
    answers = [browser.post("/login/", {"username": "olga", "password": f"guess-{i}"}).status_code
               for i in range(30)]
    assert answers[0] == 200 and answers[-1] == 429
    locked = browser.post("/login/", {"username": "olga", "password": "the-right-one"})
    assert locked.status_code == 429 and b"Too many failed logins" in locked.content
    assert "_auth_user_id" not in browser.session
    # another address is not locked out of the account
    other = Client(REMOTE_ADDR="10.9.8.7")
    assert other.post("/login/", {"username": "olga", "password": "the-right-one"}).status_code == 302
