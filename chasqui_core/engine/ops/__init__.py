"""What operators read and do, for the console, the API and the CLI: find a job (``lookup``), browse waiting
and running jobs, queue figures, counters and history, and the few commands: cancel, purge, pause, quiet and
stop a worker. Reads here are paged and bounded; none scans a queue whole."""
