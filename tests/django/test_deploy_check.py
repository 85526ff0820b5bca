"""`manage.py check --deploy` of the demo project passes with the environment variables the README documents.

Run in a subprocess, as an operator would, with the README's production values (see "Configuration"):
no warning may be left, since a deployment checklist full of accepted warnings hides the next real one.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "chasqui.example.com",
    "HTTPS": "true",
    "SMTP_URL": "smtp://mailer:secret@smtp.example.com:587",
    "CHASQUI_SIGNING_KEYS": secrets.token_hex(32),
}


def _check(**env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("DEBUG", "HTTPS", "SMTP_URL", "SECRET_KEY", "ALLOWED_HOSTS", "CHASQUI_SIGNING_KEYS",
                            "CHASQUI_DEMO", "DJANGO_SETTINGS_MODULE")}
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=ROOT, env={**environ, **env}, capture_output=True, text=True, timeout=120)


def test_the_readmes_production_variables_pass_check_deploy():
    done = _check(**PRODUCTION)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_every_variable_used_here_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for name in PRODUCTION:
        assert re.search(rf"^\| `{name}`", readme, re.M), f"{name} is not in the README's table"


@pytest.mark.parametrize("left_out, warning", [("HTTPS", "security.W008"), ("SMTP_URL", "mail.E001")])
def test_without_them_check_deploy_says_what_is_missing(left_out, warning):
    done = _check(**{k: v for k, v in PRODUCTION.items() if k != left_out})
    assert done.returncode != 0
    assert warning in done.stdout + done.stderr


def test_a_wrong_smtp_url_is_an_error_naming_the_variable():
    done = _check(**{**PRODUCTION, "SMTP_URL": "mail.example.com"})
    assert done.returncode != 0
    assert "SMTP_URL must look like smtp://" in done.stderr
