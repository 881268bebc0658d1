"""The Django admin shows the gateway's permission rules and its (read-only) audit log."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from gateway.models import AuditRecord, DestinationPermission

pytestmark = pytest.mark.django_db


def test_permission_rules_are_listed_with_their_grantees(client):
    root = User.objects.create_superuser("root", password="pw")
    rule = DestinationPermission.objects.create(destination="orders.>", can_read=True)
    rule.users.add(root)
    client.force_login(root)
    page = client.get("/admin/gateway/destinationpermission/")
    assert page.status_code == 200
    assert b"queue://orders.&gt;" in page.content and b"root" in page.content


def test_the_audit_log_is_read_only(client):
    root = User.objects.create_superuser("root", password="pw")
    record = AuditRecord.objects.create(user=root, username="root", action="purge", destination="queue://a",
                                        succeeded=True, status_code=200)
    client.force_login(root)
    assert client.get("/admin/gateway/auditrecord/").status_code == 200
    assert client.get("/admin/gateway/auditrecord/add/").status_code == 403
    assert client.post(f"/admin/gateway/auditrecord/{record.pk}/delete/", {"post": "yes"}).status_code == 403


def test_a_rule_with_a_bad_pattern_is_refused_by_the_form():
    rule = DestinationPermission(destination="orders..eu")
    with pytest.raises(Exception, match="empty segment"):
        rule.full_clean()
