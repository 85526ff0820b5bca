"""Jobs that wait for a time: the delayed set (scheduled runs and retries), the promoter that moves due jobs
back to their stream, schedules and their scheduler, and the leader lock that lets one process do each."""
