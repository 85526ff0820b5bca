"""The dead-letter queue as operators use it: browse, search, replay, discard.

A queue's DLQ is a Redis stream whose entry ids carry the time each job died,
so a time range is an id range and a page is one XREVRANGE call, quick at any
size. Filters on task, reason, error class or group read an index the
scripts keep beside the stream; a text filter scans in bounded chunks, and the bulk operations
act one chunk per call, so sweeping 100,000 entries never blocks Redis for
long and an operator can stop a sweep half way (what is done stays done).

Replays go through ``dlq_move.lua``, which deletes each entry and re-publishes
it in one step: two operators replaying the same entries at once publish each
job once.

The client must return bytes (``decode_responses=False``), as the engine's
``connect()`` does: payloads are msgpack.

The modules, in the order they build on each other:

- ``entries``: entry ids, and a DLQ entry decoded into a ``DeadJob``
- ``fingerprint``: the error fingerprint that groups failures with one cause
- ``filter``: ``DLQFilter``, which dead jobs to show or act on
- ``index``: ``DLQIndex``, the counts and entry sets the scripts keep as they write and remove entries
- ``browse``: ``DLQReader``: pages, counts, lookups and error groups
- ``selection``: what a bulk replay or discard acts on, chunk by chunk, through the index when it can
- ``replay``: ``DeadLetters``: everything ``DLQReader`` reads, plus replay and discard
- ``operations``: replays and discards by filter run by workers, with their progress in Redis
- ``retention``: how much of a DLQ is kept (at most N entries, D days), and the trim that keeps it so
"""
