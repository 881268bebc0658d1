"""Spec §12 Duplicate detection."""
