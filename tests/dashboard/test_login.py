"""The console's own login: a member of "Chasqui viewers", who is not staff, logs in and sees the console."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = [pytest.mark.urls("tests.dashboard.console_urls")]

PASSWORD = "a-long-enough-password-1"


@pytest.fixture(autouse=True)
def console_login(settings):
    settings.LOGIN_URL = "chasqui_console:login"


def _password(user) -> None:
    user.set_password(PASSWORD)
    user.save()


def test_a_viewer_who_is_not_staff_logs_in_and_sees_the_console(viewer):
    assert not viewer.is_staff
    _password(viewer)
    browser = Client()
    sent = browser.get("/chasqui/queues/emails/")
    assert sent.status_code == 302 and sent["Location"] == "/chasqui/login/?next=/chasqui/queues/emails/"
    page = browser.get(sent["Location"])
    assert page.status_code == 200 and b'name="password"' in page.content and b"csrfmiddlewaretoken" in page.content
    done = browser.post(
        "/chasqui/login/", {"username": viewer.username, "password": PASSWORD, "next": "/chasqui/queues/emails/"}
    )
    assert done.status_code == 302 and done["Location"] == "/chasqui/queues/emails/"
    overview = browser.get("/chasqui/")
    assert overview.status_code == 200 and b"Overview" in overview.content
    assert viewer.username.encode() in overview.content  # "Log out vera": the console knows who is there


def test_without_a_next_the_login_lands_on_the_overview_and_logout_comes_back_to_it(viewer):
    _password(viewer)
    browser = Client()
    done = browser.post("/chasqui/login/", {"username": viewer.username, "password": PASSWORD})
    assert done.status_code == 302 and done["Location"] == "/chasqui/"
    out = browser.post("/chasqui/logout/")
    assert out.status_code == 302 and out["Location"] == "/chasqui/login/"
    assert browser.get("/chasqui/").status_code == 302


def test_a_wrong_password_is_refused_in_words(viewer):
    _password(viewer)
    page = Client().post("/chasqui/login/", {"username": viewer.username, "password": "wrong"})
    assert page.status_code == 200 and b"enter a correct username and password" in page.content


def test_a_next_to_another_site_is_not_followed(viewer):
    _password(viewer)
    done = Client().post(
        "/chasqui/login/", {"username": viewer.username, "password": PASSWORD, "next": "https://evil.example/"}
    )
    assert done.status_code == 302 and done["Location"] == "/chasqui/"


def test_htmx_polls_of_a_lapsed_session_are_sent_to_the_login_by_url_name(db):
    response = Client().get(
        "/chasqui/queues/emails/", headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/chasqui/"}
    )
    assert response.status_code == 401 and response["HX-Redirect"] == "/chasqui/login/?next=/chasqui/"
