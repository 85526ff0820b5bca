"""Crash recovery: the start journal that says which runs were under way when a worker died (``journal``),
and leases, death records and the reclaim that puts a silent worker's jobs back (``reclaim``)."""
