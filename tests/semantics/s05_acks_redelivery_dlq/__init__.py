"""Spec §5 Acknowledgement, redelivery, DLQ."""
