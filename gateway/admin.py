"""Django admin for the gateway's tables: destination permissions (granted to users and groups) and
the audit log (read only)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from gateway.models import AuditRecord, DestinationPermission


@admin.register(DestinationPermission)
class DestinationPermissionAdmin(admin.ModelAdmin):
    list_display = ("destination", "can_read", "can_write", "can_admin", "grantees", "description")
    list_filter = ("can_read", "can_write", "can_admin")
    search_fields = ("destination", "description", "users__username", "groups__name")
    filter_horizontal = ("users", "groups")

    @admin.display(description="granted to")
    def grantees(self, rule: DestinationPermission) -> str:
        names = [u.get_username() for u in rule.users.all()] + [f"group {g.name}" for g in rule.groups.all()]
        return ", ".join(names) or "nobody"

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).prefetch_related("users", "groups")


@admin.register(AuditRecord)
class AuditRecordAdmin(admin.ModelAdmin):
    list_display = ("at", "username", "action", "destination", "target", "succeeded", "status_code")
    list_filter = ("succeeded", "action")
    search_fields = ("username", "destination", "target", "action")
    date_hierarchy = "at"

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
