"""How a job names its place in a workflow: keys of its envelope's meta.

Meta rather than a new envelope field: every path that copies an envelope
(retry, replay, requeue, reclaim, promote) carries meta untouched, a job
outside any workflow carries nothing, and meta is outside the signature, so
the value a callback is fed (written by Redis when it fires) leaves a signed
job's signature valid.
"""

from __future__ import annotations

FLOW = "flow"
"""Meta key: the id of the batch this job is a child of."""

AFTER = "after"
"""Meta key: the id of the batch whose callback this job is (its on_success or on_complete), for the links of
operators' pages; unlike ``FLOW``, its end counts in no batch."""

FED = "fed"
"""Meta key: the value a step is fed (the previous step's result, or its batch's results in order), passed to its
task as the first positional argument. Written by ``flows.lua`` when the callback fires, never by a producer."""
