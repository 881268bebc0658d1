"""Spec §14 Management view: operator operations, subscription listing."""
