"""`{% name_url 'console:queue' destination.name %}`: `{% url %}` for the routes that take names, which may
hold `/` or `%` (gateway/paths.py: Django's reverse cannot encode them as one segment)."""

from __future__ import annotations

from typing import Any

from django import template

from gateway.paths import reverse_named

register = template.Library()


@register.simple_tag
def name_url(viewname: str, *args: Any) -> str:
    return reverse_named(viewname, *args)
