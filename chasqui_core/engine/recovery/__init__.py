"""Crash recovery: the start journal that says which runs were under way when a worker died (``journal``),
leases, death records and the reclaim that puts a silent worker's jobs back (``reclaim``), and the look at
workers of the same host whose processes are gone (``deathwatch``)."""
