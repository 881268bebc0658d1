"""Spec §6 Expiry."""
