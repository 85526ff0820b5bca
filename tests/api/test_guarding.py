"""Guessing is slowed, permission comes before anything else, and every error is JSON."""

import pytest
from django.test import Client

from .helpers import ApiClient

Q = "default"


def test_wrong_api_keys_from_one_address_get_429_with_retry_after(db, view_api, settings, redis):
    settings.API_KEY_FAILURE_LIMIT = 20
    guesser = ApiClient("not-a-key")
    answers = [guesser.get("/api/queues").status_code for _ in range(60)]
    assert answers[:20] == [401] * 20 and set(answers[20:]) == {429}
    blocked = guesser.get("/api/queues")
    assert blocked.status_code == 429 and blocked.json()["detail"].startswith("Too many requests with a wrong API key")
    assert 0 < int(blocked["Retry-After"]) <= settings.API_KEY_FAILURE_WINDOW
    # counted in Redis, where every web process reads the same count
    assert int(redis.get(b"chasqui:api:key-failures:127.0.0.1:not-a-ke")) == 61


def test_a_right_key_is_served_from_an_address_whose_wrong_keys_are_over_the_limit(db, view_api, settings):
    settings.API_KEY_FAILURE_LIMIT = 3
    stale = ApiClient(view_api.key[:8] + "x" * 35)  # even a wrong key with the right key's prefix
    assert [stale.get("/api/queues").status_code for _ in range(5)] == [401, 401, 401, 429, 429]
    assert view_api.get("/api/queues").status_code == 200
    other_prefix = ApiClient("y" * 43)
    assert other_prefix.get("/api/queues").status_code == 401, "another prefix has a count of its own"


def test_behind_a_trusted_proxy_each_client_has_its_own_count(db, settings):
    settings.API_KEY_FAILURE_LIMIT = 2
    settings.CHASQUI = {"TRUSTED_PROXIES": ["10.0.0.0/8"]}

    def wrong(forwarded_for: str, remote: str = "10.0.0.5") -> int:
        client = ApiClient("not-a-key")
        return client.client.get("/api/queues", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded_for).status_code

    assert [wrong("198.51.100.1") for _ in range(3)] == [401, 401, 429]
    assert wrong("198.51.100.2") == 401, "another client behind the same proxy is not counted with the first"
    # a client that writes its own X-Forwarded-For is read from the right: the proxy's entry is what counts
    assert wrong("203.0.113.9, 198.51.100.1") == 429
    # from an address that is no trusted proxy, the header is ignored: the count is REMOTE_ADDR's
    assert [wrong("192.0.2.77", remote="192.0.2.200") for _ in range(3)] == [401, 401, 429]
    assert wrong("192.0.2.78", remote="192.0.2.200") == 429


def test_429_and_its_retry_after_are_in_the_schema(db):
    schema = ApiClient().client.get("/api/openapi.json").json()
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            if operation.get("security") == []:
                continue
            too_many = operation["responses"].get("429")
            assert too_many is not None, (method, path)
            assert "Retry-After" in too_many["headers"], (method, path)


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


def test_a_trusted_proxies_setting_that_is_not_a_list_of_networks_names_itself(settings):
    from django.core.exceptions import ImproperlyConfigured

    from chasqui_core.conf import load

    with pytest.raises(ImproperlyConfigured, match=r"settings.CHASQUI\['TRUSTED_PROXIES'\] holds 'proxy'"):
        load({"TRUSTED_PROXIES": ["proxy"]})
    with pytest.raises(ImproperlyConfigured, match=r"TRUSTED_PROXIES'\] must be a list"):
        load({"TRUSTED_PROXIES": "10.0.0.1"})
