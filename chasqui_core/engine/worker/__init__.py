"""A worker process's parts, in the order a job meets them: the reader takes entries off a queue's streams
(``reader``), admission decides what each may do (``admission``), and the runner runs it on the loop or the
sync lane (``running``, ``sync_lane``) under limits (``limits``), while in-flight bookkeeping (``inflight``,
``delivery``), the cancel watch and housekeeping run beside it. ``worker.Worker`` composes the parts and is the
only one that knows them all. What a run came to is written by ``engine.settle``; crashes are repaired by
``engine.recovery``."""
