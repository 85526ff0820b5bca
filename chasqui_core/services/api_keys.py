"""API keys: issued and revoked from the CLI, checked on every API request that carries one.

A module of its own rather than part of ``audit``: keys are credentials, not
a record of changes, and the API's authentication needs them without any of
the queue areas. Only superusers (or the shell) may issue or revoke them;
both are audited.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from chasqui_core.models import KEY_PREFIX_LENGTH, ApiKey, AuditEntry, hash_key
from chasqui_core.services.audit import record
from chasqui_core.services.common import InvalidInput, NotFound, Source, check_source

API_KEY_TOUCH_INTERVAL = timedelta(minutes=1)


def create_api_key(actor, username: str, *, name: str = "", source: Source) -> tuple[ApiKey, str]:
    """Issue a key for user ``username``; returns the row and the key (shown once, stored as a hash)."""
    check_source(source)
    _require_key_admin(actor, source)
    User = get_user_model()
    try:
        user = User.objects.get(**{User.USERNAME_FIELD: username})
    except User.DoesNotExist:
        raise NotFound(f"No user named {username!r}") from None
    if not user.is_active:
        raise InvalidInput(f"User {username!r} is inactive: an API key would not work")
    row, key = ApiKey.issue(user, name=name)
    record(actor, AuditEntry.Action.APIKEY_CREATE, source=source, target_ids=[row.prefix], count=1,
           detail={"user": user.get_username(), "name": name})
    return row, key


def revoke_api_key(actor, prefix: str, *, source: Source) -> ApiKey:
    """Revoke the active key starting with ``prefix`` (its shown prefix, or the whole key)."""
    check_source(source)
    _require_key_admin(actor, source)
    prefix = (prefix or "").strip()
    if not prefix:
        raise InvalidInput("Give the key's prefix (as shown when it was created or in the admin)")
    active = ApiKey.objects.filter(revoked_at__isnull=True)
    if len(prefix) > KEY_PREFIX_LENGTH:  # the whole key was given
        matches = list(active.filter(key_hash=hash_key(prefix)))
    else:
        matches = list(active.filter(prefix__startswith=prefix))
    if not matches:
        raise NotFound(f"No active API key starts with {prefix!r}")
    if len(matches) > 1:
        raise InvalidInput(f"{len(matches)} active keys start with {prefix!r}: give more characters")
    row = matches[0]
    row.revoked_at = timezone.now()
    row.save(update_fields=["revoked_at"])
    record(actor, AuditEntry.Action.APIKEY_REVOKE, source=source, target_ids=[row.prefix], count=1,
           detail={"user": row.user.get_username(), "name": row.name})
    return row


def _require_key_admin(actor, source: str) -> None:
    if actor is None and source == "cli":
        return
    if actor is None or not getattr(actor, "is_superuser", False):
        raise PermissionDenied("Permission denied: only superusers can create or revoke API keys")


def authenticate_api_key(key: str):
    """The active user a bearer key belongs to, or None (unknown, revoked, or user inactive).

    ``last_used_at`` is written at most once a minute per key, so a busy
    script does not turn every read into a database write.
    """
    if not isinstance(key, str) or not key or len(key) > 200:
        return None
    try:
        row = ApiKey.objects.select_related("user").get(key_hash=hash_key(key), revoked_at__isnull=True)
    except ApiKey.DoesNotExist:
        return None
    user = row.user
    if not user.is_active:
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at >= API_KEY_TOUCH_INTERVAL:
        ApiKey.objects.filter(pk=row.pk).update(last_used_at=now)
    user.chasqui_api_key = row.prefix
    return user
