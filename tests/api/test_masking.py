"""Secrets never reach an API response."""

import pytest

from chasqui_core.masking import MASK, mask, mask_text

from tests.helpers import add_dead, dead_job

from .helpers import add_delayed

pytestmark = pytest.mark.django_db

Q = "default"
SECRET = "hunter2-very-secret"
TOKEN = "tok_9f8e7d6c5b4a"


def test_mask_structures_by_key_name():
    data = {"user": "ann", "password": "x", "nested": [{"Api_Key": 12345, "n": 1}], "AUTHORIZATION": ["a", "b"]}
    assert mask(data) == {"user": "ann", "password": MASK, "nested": [{"Api_Key": MASK, "n": 1}],
                          "AUTHORIZATION": MASK}
    assert mask(data, keys=["user"])["user"] == MASK
    assert data["password"] == "x"  # the input is left alone


@pytest.mark.parametrize("text,hidden", [
    ("login failed: password=hunter2 for ann", "hunter2"),
    ('payload {"token": "abc123def"} rejected', "abc123def"),
    ("KeyError: {'secret': 'xyz789', 'id': 4}", "xyz789"),
    ("GET /x headers={'Authorization': 'Bearer eyJhbGciOi.payload.sig'}", "eyJhbGciOi"),
    ("Authorization: Bearer eyJhbGciOi.payload.sig", "eyJhbGciOi"),
    ("could not connect to redis://app:s3cr3tpw@cache:6379/0", "s3cr3tpw"),
    ("api_key = AKIAIOSFODNN7 rejected", "AKIAIOSFODNN7"),
])
def test_mask_text_hides_values_and_keeps_the_rest(text, hidden):
    masked = mask_text(text)
    assert hidden not in masked
    assert MASK in masked
    assert masked.split()[0] == text.split()[0]


def test_plain_text_is_untouched():
    text = "ValueError: row 17 has 3 columns, expected 4 (tokens are fine as a word)"
    assert mask_text(text) == text


def test_dlq_responses_mask_kwargs_messages_and_tracebacks(view_api, redis):
    job = dead_job(kwargs={"email": "a@b.c", "password": SECRET},
                   messages=(f"auth failed with token={TOKEN}",))
    eid = add_dead(redis, Q, job)
    listing = view_api.get(f"/api/queues/{Q}/dlq").content.decode()
    detail = view_api.get(f"/api/queues/{Q}/dlq/{eid}")
    groups = view_api.get(f"/api/queues/{Q}/dlq/groups").content.decode()
    for text in (listing, detail.content.decode(), groups):
        assert SECRET not in text and TOKEN not in text
    body = detail.json()
    assert body["kwargs"] == {"email": "a@b.c", "password": MASK}
    assert body["error"] == f"auth failed with token={MASK}"
    assert TOKEN not in body["errors"][0]["traceback"] and MASK in body["errors"][0]["traceback"]


def test_delayed_responses_mask_kwargs(view_api, redis):
    job_id = add_delayed(redis, Q, kwargs={"db_password": SECRET, "n": 1})
    listing = view_api.get(f"/api/queues/{Q}/delayed")
    assert SECRET not in listing.content.decode()
    assert listing.json()["items"][0]["kwargs"] == {"db_password": MASK, "n": 1}
    assert SECRET not in view_api.get(f"/api/queues/{Q}/delayed/{job_id}").content.decode()


def test_masked_keys_come_from_settings(view_api, redis, settings):
    settings.CHASQUI = {"MASKED_KEYS": ["pin"]}
    add_delayed(redis, Q, kwargs={"pin": "1234", "password": "visible-now"})
    kwargs = view_api.get(f"/api/queues/{Q}/delayed").json()["items"][0]["kwargs"]
    assert kwargs == {"pin": MASK, "password": MASK}  # the setting adds keys; the built-in ones stay


LEAKY = "password=x9TopSecret"


def test_secrets_are_masked_before_errors_are_grouped(view_api, redis):
    """Digits were normalised before masking, so the tail of a secret survived into the fingerprint."""
    for n in range(3):
        add_dead(redis, Q, dead_job(messages=(f"login {n} refused: {LEAKY}",)))
    groups = view_api.get(f"/api/queues/{Q}/dlq/groups").json()["items"]
    assert len(groups) == 1
    assert "TopSecret" not in str(groups) and MASK in groups[0]["fingerprint"]
    listing = view_api.get(f"/api/queues/{Q}/dlq", fingerprint=groups[0]["fingerprint_id"]).json()["items"]
    assert len(listing) == 3 and "TopSecret" not in str(listing)


@pytest.mark.parametrize("key", ["pwd", "private_key", "session_id", "sessionid", "Cookie", "credentials",
                                 "PASSWD", "client_secret"])
def test_every_usual_secret_key_is_masked(key):
    assert mask({key: "s3cr3t-value"}) == {key: MASK}
    assert "s3cr3t-value" not in mask_text(f"request failed: {key}=s3cr3t-value")


def test_masked_keys_setting_adds_to_the_built_in_list(settings):
    settings.CHASQUI = {"MASKED_KEYS": ["iban"]}
    assert mask({"iban": "DE89370400440532013000", "password": "x"}) == {"iban": MASK, "password": MASK}
