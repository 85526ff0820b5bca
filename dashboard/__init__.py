"""The operator console: live view of queues, jobs and workers."""
