"""``manage.py ensure_admin``: a first login for a fresh checkout.

``make run`` calls it on every start. The first time it creates the superuser
``admin`` with a random password, prints it and saves it to a file readable
only by the current user; later runs leave the user alone and say where the
password is, so restarts never reset a password someone may have changed.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

USERNAME = "admin"
WHERE = "for the console; `make run` prints its address once it answers"


def default_password_file() -> Path:
    return Path(settings.BASE_DIR) / "var" / "admin-password.txt"


def write_private_file(path: Path, content: str) -> None:
    """Write ``content`` to ``path`` with mode 0600, even if the file existed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)  # O_CREAT's mode does not apply to existing files
        fh.write(content)


class Command(BaseCommand):
    help = f"Create the superuser '{USERNAME}' with a random password if it does not exist."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--password-file",
            type=Path,
            default=None,
            help="Where to save the generated password (default: var/admin-password.txt).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password_file: Path = options["password_file"] or default_password_file()
        User = get_user_model()

        if User._default_manager.filter(**{User.USERNAME_FIELD: USERNAME}).exists():
            if password_file.exists():
                self.stdout.write(
                    f"Admin login: {USERNAME} / password saved in {password_file}  ({WHERE})"
                )
            else:
                self.stdout.write(
                    f"User '{USERNAME}' exists. To set a new password run: "
                    f"python manage.py changepassword {USERNAME}"
                )
            return

        password = secrets.token_urlsafe(12)
        with transaction.atomic():
            User._default_manager.create_superuser(
                **{User.USERNAME_FIELD: USERNAME},
                email="admin@example.com",
                password=password,
            )
        write_private_file(password_file, password + "\n")
        self.stdout.write(
            self.style.SUCCESS(f"Admin login: {USERNAME} / {password}  ({WHERE})")
        )
        self.stdout.write(f"(password saved in {password_file})")
