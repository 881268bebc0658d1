"""Spec §7 Topics: fan-out, non-durable and durable subscriptions, retroactive consumers."""
