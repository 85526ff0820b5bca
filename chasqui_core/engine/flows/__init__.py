"""Workflows: batches of jobs with callbacks, chains and fan-in, counted exactly once in Redis.

A job of a workflow carries its batch's id in its envelope's meta (``refs``);
the script that settles it (``settle.lua``, ``dlq_discard.lua``) records its
end in the batch and enqueues the callback that end makes due, in the same
atomic call (``store/lua/flows.lua``). ``callbacks`` stores a callback so that
script can feed it the batch's results; ``batches`` starts, grows and reads
batches. See docs/workflows.md.
"""
