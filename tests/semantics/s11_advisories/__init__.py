"""Spec §11 Advisory topics."""
