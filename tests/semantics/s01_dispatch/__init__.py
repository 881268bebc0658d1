"""Spec §1 Queue dispatch: consumer order, prefetch windows, priority, close; the dispatch pass."""
