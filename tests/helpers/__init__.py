"""Helpers shared by the test suites: Channels communicators, Celery test tasks, processes."""
