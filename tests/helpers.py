"""Helpers shared by every test folder (fixtures live in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The project's folder: where ``manage.py`` is, and the working directory of the processes tests start."""


def subprocess_database_url() -> str:
    """The test database as a ``DATABASE_URL``, so a worker or server the test starts sees the same rows."""
    from django.db import connection

    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
