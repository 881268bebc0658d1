"""The gateway's own tables: per-destination permissions (ActiveMQ's authorization entries, granted to
users and groups) and the audit record of administrative actions. Broker state is not here: it is Redis.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models

from broker_core.destinations import parse_destination
from broker_core.errors import InvalidDestination

ACTIONS = ("read", "write", "admin")


class DestinationPermission(models.Model):
    """One authorization entry: a destination pattern and the actions it grants to users and groups.

    The pattern follows ActiveMQ's wildcards (spec §10.5): `queue://orders.>`, `topic://prices.*`, `>`;
    without a scheme it is a queue pattern. Like ActiveMQ's DefaultAuthorizationMap, every matching
    entry counts: grants add up, nothing denies. `admin` implies `read` and `write`.
    """

    destination = models.CharField(
        max_length=220,
        help_text="Destination or ActiveMQ wildcard pattern, e.g. queue://orders.> (no scheme: a queue).",
    )
    can_read = models.BooleanField("read", default=False, help_text="Consume and browse.")
    can_write = models.BooleanField("write", default=False, help_text="Produce.")
    can_admin = models.BooleanField(
        "admin", default=False, help_text="Administer (purge, move, policies...); implies read and write."
    )
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True,
                                   related_name="destination_permissions")
    groups = models.ManyToManyField(Group, blank=True, related_name="destination_permissions")
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["destination", "pk"]

    def __str__(self) -> str:
        actions = [a for a in ACTIONS if getattr(self, f"can_{a}")]
        return f"{self.destination} ({', '.join(actions) or 'nothing'})"

    def clean(self) -> None:
        try:
            self.destination = parse_destination(self.destination.strip(), allow_wildcards=True).uri
        except InvalidDestination as exc:
            raise ValidationError({"destination": exc.message}) from None

    def save(self, *args: object, **kwargs: object) -> None:
        self.destination = parse_destination(self.destination.strip(), allow_wildcards=True).uri
        super().save(*args, **kwargs)


class AuditRecord(models.Model):
    """Who did which administrative action on what, when, and how it ended."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+")
    username = models.CharField(max_length=150, blank=True)  # kept when the user is deleted
    action = models.CharField(max_length=64, db_index=True)
    destination = models.CharField(max_length=220, blank=True, db_index=True)
    target = models.CharField(max_length=256, blank=True, help_text="Message id, group id, consumer...")
    parameters = models.JSONField(default=dict, blank=True)
    succeeded = models.BooleanField()
    status_code = models.PositiveSmallIntegerField()
    result = models.JSONField(default=dict, blank=True, help_text="The outcome, or the problem details.")
    remote_addr = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        outcome = "ok" if self.succeeded else f"failed {self.status_code}"
        who = self.username or "-"
        return f"{self.at:%Y-%m-%d %H:%M:%S} {who} {self.action} {self.destination} {outcome}"
