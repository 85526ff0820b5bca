"""Who may do what: Chasqui's permissions and the two ready-made groups.

Each change an operator can make needs one Django permission, so a site can
grant "replay but never discard" with the admin it already knows. Reading
needs ``view_queues``; a user with only that can see everything and change
nothing. The groups are created by a migration and re-created on demand
(``ensure_groups``), since a test database flush or a hand-made database may
lack them.
"""

from __future__ import annotations

APP_LABEL = "chasqui_core"

VIEW = "view_queues"
ENQUEUE = "enqueue_jobs"
REPLAY = "replay_jobs"
DISCARD = "discard_jobs"
PAUSE = "pause_queues"

PERMISSIONS: dict[str, str] = {
    VIEW: "View queues, jobs, workers and the audit log",
    ENQUEUE: "Enqueue jobs and run delayed jobs now",
    REPLAY: "Replay dead jobs",
    DISCARD: "Discard dead jobs and cancel delayed jobs",
    PAUSE: "Pause and resume queues",
}
"""Codename -> name, as declared on ``QueueAccess.Meta.permissions``."""

OPERATORS = "Chasqui operators"
VIEWERS = "Chasqui viewers"

GROUPS: dict[str, tuple[str, ...]] = {
    OPERATORS: tuple(PERMISSIONS),
    VIEWERS: (VIEW,),
}


def full_name(codename: str) -> str:
    """The ``app_label.codename`` form that ``user.has_perm`` takes."""
    return f"{APP_LABEL}.{codename}"


def has(user, codename: str) -> bool:
    return user is not None and bool(user.has_perm(full_name(codename)))


def ensure_groups(apps=None) -> None:
    """Create the permissions and both groups if missing; safe to call any time.

    ``apps`` is a migration's app registry (historical models); None uses the
    live models.
    """
    if apps is None:
        from django.contrib.auth.models import Group, Permission
        from django.contrib.contenttypes.models import ContentType
    else:
        Group = apps.get_model("auth", "Group")
        Permission = apps.get_model("auth", "Permission")
        ContentType = apps.get_model("contenttypes", "ContentType")
    content_type, _ = ContentType.objects.get_or_create(app_label=APP_LABEL, model="queueaccess")
    perms = {}
    for codename, name in PERMISSIONS.items():
        perms[codename], _ = Permission.objects.get_or_create(
            content_type=content_type, codename=codename, defaults={"name": name}
        )
    for group_name, codenames in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=group_name)
        group.permissions.add(*(perms[c] for c in codenames))
