"""Spec §13 PolicyEntry fields: defaults, validation, resolution, policy files."""
