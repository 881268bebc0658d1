"""Spec §10 Virtual destinations (composites, virtual topics, mirrored queues) and wildcards."""
