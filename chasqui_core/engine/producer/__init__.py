"""The producer side: a job is put on a queue here (``queue.Queue``), over a link that survives a server
restart and never adds twice (``link``)."""
