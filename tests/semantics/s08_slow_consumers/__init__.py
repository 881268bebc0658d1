"""Spec §8 Slow consumers: marking, pending-message limits, eviction."""
