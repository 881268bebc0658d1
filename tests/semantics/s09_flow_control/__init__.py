"""Spec §9 Flow control and memory."""
