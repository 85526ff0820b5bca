"""Admin pages for the audit log (read-only), API keys (hash never shown) and
background operations."""

from django.contrib import admin
from django.utils import timezone

from chasqui_core.models import ApiKey, AuditEntry, Operation, OutboxEntry
from chasqui_core.services.audit import record


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("at", "actor_repr", "action", "queue", "source", "count")
    list_filter = ("action", "source", "queue")
    search_fields = ("actor_repr", "queue")
    date_hierarchy = "at"
    readonly_fields = [f.name for f in AuditEntry._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are created with ``manage.py chasqui apikey create``, which shows the key once."""

    list_display = ("prefix", "name", "user", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("prefix", "name", "user__username")
    fields = ("prefix", "name", "user", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "user", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        revoked = 0
        for row in queryset.filter(revoked_at__isnull=True).select_related("user"):
            row.revoked_at = timezone.now()
            row.save(update_fields=["revoked_at"])
            record(request.user, AuditEntry.Action.APIKEY_REVOKE, source="console", target_ids=[row.prefix],
                   count=1, detail={"user": row.user.get_username(), "name": row.name, "via": "admin"})
            revoked += 1
        self.message_user(request, f"Revoked {revoked} key(s).")


@admin.register(Operation)
class OperationAdmin(admin.ModelAdmin):
    list_display = ("created_at", "kind", "queue", "status", "done", "total", "count", "created_by")
    list_filter = ("kind", "status", "queue")
    readonly_fields = [f.name for f in Operation._meta.fields if f.name != "cancel_requested"]

    def has_add_permission(self, request):
        return False


@admin.register(OutboxEntry)
class OutboxEntryAdmin(admin.ModelAdmin):
    """Jobs committed but not yet relayed to Redis (normally empty)."""

    list_display = ("job_id", "queue", "created_at", "attempts", "last_error")
    list_filter = ("queue",)
    search_fields = ("job_id",)
    readonly_fields = ("queue", "job_id", "when", "created_at", "attempts", "last_error")
    exclude = ("payload",)
