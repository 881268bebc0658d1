"""Spec §3 Message groups."""
