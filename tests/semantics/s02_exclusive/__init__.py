"""Spec §2 Exclusive consumers."""
