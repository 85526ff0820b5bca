"""The project skeleton: settings parsing, pages, and the ensure_admin command."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from config.env import env_bool, env_list

BASE_DIR = Path(settings.BASE_DIR)


# --- settings parsing --------------------------------------------------------


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "Yes", "on", " on "])
def test_env_bool_true_spellings(raw: str) -> None:
    assert env_bool("FLAG", False, environ={"FLAG": raw}) is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "NO", "off"])
def test_env_bool_false_spellings(raw: str) -> None:
    assert env_bool("FLAG", True, environ={"FLAG": raw}) is False


@pytest.mark.parametrize("environ", [{}, {"FLAG": ""}, {"FLAG": "  "}])
def test_env_bool_unset_or_empty_gives_default(environ: dict[str, str]) -> None:
    assert env_bool("FLAG", True, environ=environ) is True
    assert env_bool("FLAG", False, environ=environ) is False


@pytest.mark.parametrize("raw", ["ture", "2", "enabled", "y"])
def test_env_bool_rejects_unknown_values_with_a_clear_message(raw: str) -> None:
    with pytest.raises(ImproperlyConfigured) as excinfo:
        env_bool("DEBUG", True, environ={"DEBUG": raw})
    message = str(excinfo.value)
    assert "DEBUG" in message
    assert repr(raw) in message
    assert "true" in message and "false" in message


def test_env_bool_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHASQUI_TEST_FLAG", "off")
    assert env_bool("CHASQUI_TEST_FLAG", True) is False


def test_env_list() -> None:
    assert env_list("HOSTS", "a,b", environ={}) == ["a", "b"]
    assert env_list("HOSTS", ["x"], environ={}) == ["x"]
    assert env_list("HOSTS", "a", environ={"HOSTS": " example.com, ,api.example.com,"}) == [
        "example.com",
        "api.example.com",
    ]
    assert env_list("HOSTS", "a", environ={"HOSTS": ""}) == []


def _import_settings(**env: str) -> subprocess.CompletedProcess[str]:
    """Import config.settings in a fresh interpreter with the given environment."""
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS"}}
    return subprocess.run(
        [sys.executable, "-c", "import config.settings as s; print(s.DEBUG, s.ALLOWED_HOSTS)"],
        cwd=BASE_DIR,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_settings_defaults() -> None:
    result = _import_settings()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True ['127.0.0.1', 'localhost', 'testserver']"


def test_settings_reject_a_bad_debug_value() -> None:
    result = _import_settings(DEBUG="maybe")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "DEBUG='maybe'" in result.stderr


def test_settings_require_a_secret_key_without_debug() -> None:
    result = _import_settings(DEBUG="0")
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr

    result = _import_settings(DEBUG="0", SECRET_KEY="s3cret-for-the-test")
    assert result.returncode == 0, result.stderr


def test_chasqui_core_comes_before_channels() -> None:
    """Our runworker command must shadow the one Channels ships."""
    from django.core.management import get_commands

    apps = settings.INSTALLED_APPS
    assert apps.index("chasqui_core.apps.ChasquiCoreConfig") < apps.index("daphne")
    assert apps.index("chasqui_core.apps.ChasquiCoreConfig") < apps.index("channels")
    assert get_commands()["devstack"] == get_commands()["ensure_admin"] == "config", "demo commands: not shipped"


# --- pages -------------------------------------------------------------------


def test_home_redirects_anonymous_users_to_login(client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/"


def test_home_for_a_logged_in_user(client, django_user_model) -> None:
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user(username="ana", password="pw-for-tests")
    user.groups.add(Group.objects.get(name="Chasqui viewers"))
    client.force_login(user)
    response = client.get("/")
    assert response.status_code == 200
    assert b"Chasqui" in response.content
    assert b'href="/signup/"' not in response.content  # a viewer may not enqueue: no link to the demo form


@pytest.mark.django_db
def test_login_page(client) -> None:
    response = client.get("/login/")
    assert response.status_code == 200
    assert b"csrfmiddlewaretoken" in response.content


@pytest.mark.django_db
def test_the_signup_demo_is_off_for_anonymous_visitors_in_the_shipped_settings(client) -> None:
    assert client.get("/signup/").status_code == 404
    assert client.post("/signup/", {"email": "eve@example.com"}).status_code == 404
    from emails.models import Signup

    assert not Signup.objects.exists()


@pytest.mark.django_db
def test_signup_form_page(client, settings) -> None:
    settings.CHASQUI_DEMO = True
    response = client.get("/signup/")
    assert response.status_code == 200
    assert b"csrfmiddlewaretoken" in response.content
    assert b'name="email"' in response.content
    assert b'name="make_it_fail"' in response.content


# --- ensure_admin ------------------------------------------------------------


def _ensure_admin(password_file: Path) -> str:
    out = io.StringIO()
    call_command("ensure_admin", password_file=password_file, stdout=out, no_color=True)
    return out.getvalue()


def test_ensure_admin_creates_the_user_once(db, django_user_model, tmp_path: Path) -> None:
    password_file = tmp_path / "var" / "admin-password.txt"

    output = _ensure_admin(password_file)
    first_line = output.splitlines()[0]
    assert first_line.startswith("Admin login: admin / ")
    assert first_line.endswith("  (for the console; `make run` prints its address once it answers)")
    password = first_line.removeprefix("Admin login: admin / ").split("  (")[0]

    admin = django_user_model.objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff
    assert admin.check_password(password)
    assert password_file.read_text().strip() == password
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600

    output = _ensure_admin(password_file)
    assert django_user_model.objects.filter(username="admin").count() == 1
    assert password not in output
    assert str(password_file) in output
    admin.refresh_from_db()
    assert admin.check_password(password)


def test_ensure_admin_explains_how_to_reset_a_lost_password(
    db, django_user_model, tmp_path: Path
) -> None:
    django_user_model.objects.create_superuser("admin", "admin@example.com", "chosen-earlier")
    output = _ensure_admin(tmp_path / "missing.txt")
    assert "changepassword admin" in output
    assert not (tmp_path / "missing.txt").exists()
