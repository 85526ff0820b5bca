"""Mounted under any prefix, with nothing added to MIDDLEWARE, the API answers JSON errors and serves its own
documentation's files: the docs load with no network at all."""

from __future__ import annotations

import os
import re

import pytest
from django.test import Client

from api.docs import ASSETS

PREFIX = "/chasqui/api"


@pytest.fixture
def mounted(settings):
    settings.ROOT_URLCONF = "tests.api.prefix_urls"
    assert not any("json" in m.lower() and "error" in m.lower() for m in settings.MIDDLEWARE)


def test_a_path_under_the_prefix_that_no_endpoint_serves_is_a_json_404(mounted, view_api):
    for path in ("/nope", "/queues/default/nothing/here", "/docs/assets/../../settings.py"):
        response = view_api.client.get(PREFIX + path)
        assert response.status_code == 404 and response["Content-Type"].startswith("application/json"), path
        assert response.json()["detail"] == f"No such API endpoint: see {PREFIX}/docs for the list."


def test_a_method_an_endpoint_does_not_take_is_a_json_405_with_allow(mounted, view_api):
    response = view_api.client.delete(f"{PREFIX}/queues")
    assert response.status_code == 405 and response.json()["detail"] == "This endpoint does not take that method."
    assert "GET" in response["Allow"]


def test_a_body_over_the_limit_is_a_json_413(mounted, op_api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = op_api.client.post(
        f"{PREFIX}/queues/default/jobs", data="{" + " " * 5000 + "}", content_type="application/json"
    )
    assert response.status_code == 413 and "at most 1000 bytes" in response.json()["detail"]


def test_the_docs_page_names_no_other_site_and_its_files_are_served_under_the_prefix(mounted, db):
    client = Client()
    page = client.get(f"{PREFIX}/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "everything the page loads comes from here"
    referenced = re.findall(r"""(?:src|href)="([^"]+)\"""", html)
    assert {f"{PREFIX}/docs/assets/swagger-ui-bundle.js", f"{PREFIX}/docs/assets/swagger-ui.css"} <= set(referenced)
    for url in referenced:
        answer = client.get(url)
        assert answer.status_code == 200, url
        body = b"".join(answer.streaming_content)
        assert len(body) > 100, url
    assert client.get(f"{PREFIX}/docs/assets/swagger-ui-bundle.js")["Content-Type"] in (
        "text/javascript",
        "application/javascript",
    )
    assert client.get(f"{PREFIX}/docs/assets/swagger-ui-bundle.js.map").status_code == 404, "only the page's files"
    assert set(ASSETS) >= {url.rsplit("/", 1)[1] for url in referenced}


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_docs_render_in_a_browser_that_can_reach_nothing_but_the_site(redis_url, tmp_path):
    from playwright.sync_api import sync_playwright

    from dashboard.screenshots import CHROMIUM, launch, serve
    from tests.helpers import subprocess_database_url

    if not os.access(CHROMIUM, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing")
        pytest.skip(f"{CHROMIUM} is missing")
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "DATABASE_URL": subprocess_database_url(),
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    with serve(env, log_path=tmp_path / "daphne.log") as base, sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page()
            elsewhere: list[str] = []

            def only_the_site(route):
                if route.request.url.startswith(base):
                    return route.continue_()
                elsewhere.append(route.request.url)
                return route.abort()

            page.route("**/*", only_the_site)
            page.goto(f"{base}/api/docs")
            title = page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
            assert "Chasqui" in title.inner_text()
            assert page.locator(".opblock").count() > 10, "the operations are listed"
            assert elsewhere == [], f"the page tried to load from elsewhere: {elsewhere}"
        finally:
            browser.close()
