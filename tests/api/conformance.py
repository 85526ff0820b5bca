"""Every API response the tests see must match the OpenAPI schema the API publishes.

Clients generate code from that schema and dashboards parse what it promises, so a field renamed,
dropped or retyped in a response breaks them even when every status code is right. The API tests'
client (``ApiClient`` in conftest.py) checks each response it gets with ``check_response``.
"""

from __future__ import annotations

import functools
from urllib.parse import urlsplit

import requests
import schemathesis
from schemathesis.core.transport import Response

SCHEMA_PATH = "/api/openapi.json"

STATUSES_OUTSIDE_THE_SCHEMA = {
    413: "a body over the size limit, refused before any endpoint runs (api.json_errors)",
}
"""Answers the schema does not list because no single operation gives them; their body is still JSON."""


@functools.cache
def published_schema():
    """The schema as the running API serves it, not as the code is expected to build it.

    Loading it runs a request through the WSGI application, which starts and
    ends with Django's request_started and request_finished signals; their
    handler would close the test's database connection under it, so it is held
    off meanwhile, as Django's test client does.
    """
    from django.core import signals
    from django.db import close_old_connections

    from config.wsgi import application

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        return schemathesis.openapi.from_wsgi(SCHEMA_PATH, application)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def check_response(method: str, path: str, response) -> None:
    """Fail unless ``response`` (a Django test response) is one the schema documents for ``method path``."""
    __tracebackhide__ = True
    url_path = urlsplit(path).path
    operation = published_schema().find_operation_by_path(method, url_path)
    if operation is None:
        return  # an unknown path or method: the API's 404/405 answers are tested on their own
    status = response.status_code
    if operation.responses.find_by_status_code(status) is None:
        assert status in STATUSES_OUTSIDE_THE_SCHEMA, (
            f"{method} {path} answered {status}, which its schema does not list: {response.content[:500]!r}"
        )
        assert response["Content-Type"].startswith("application/json"), (method, path, status)
        return
    headers: dict[str, list[str]] = {}
    for name, value in response.items():
        headers.setdefault(name.lower(), []).append(value)
    request = requests.Request(method, f"http://testserver{path}").prepare()
    operation.validate_response(Response(status_code=status, headers=headers, content=response.content,
                                         request=request, elapsed=0.0, verify=True))
