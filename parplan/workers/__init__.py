"""Job execution: the Celery app and tasks, and the in-process executor of the embedded default."""
