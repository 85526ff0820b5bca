"""The Redis ceiling: how fast this server appends to a stream, pipelined.

Every job a queue adds or settles costs the server at least one stream
write, so the rate of bare pipelined XADDs (pre-encoded, batches of 1,000,
one connection) bounds what any client on this machine can reach. Results
are also reported as a fraction of it, which travels better between
machines than raw numbers do.
"""

from __future__ import annotations

import time

from chasqui_core.engine.jobs.envelope import Job, new_job_id

from .resp import RawPipe, encode
from .results import RATE, Measurement

SCRATCH_KEY = "bench:ceiling"
BATCH = 1000
LABEL = "Redis ceiling (pipelined XADD)"


def measure(server, *, total: int, repeats: int) -> Measurement:
    payload = Job(new_job_id(), "bench.noop", [1]).encode()  # a real job's size
    packed = encode(("XADD", SCRATCH_KEY, "*", "j", payload)) * BATCH
    batches = max(1, total // BATCH)
    samples = []
    with RawPipe(server.client) as pipe:
        for round_ in range(repeats + 1):
            server.client.delete(SCRATCH_KEY)
            rounds = max(1, batches // 10) if round_ == 0 else batches  # the first round is the warm-up
            t0 = time.perf_counter()
            for _ in range(rounds):
                pipe.run(packed, BATCH)
            seconds = time.perf_counter() - t0
            if round_:
                samples.append(rounds * BATCH / seconds)
    server.client.delete(SCRATCH_KEY)
    return Measurement("ceiling", LABEL, RATE, samples, jobs=batches * BATCH,
                       note=f"pre-encoded XADD of a {len(payload)}-byte job, pipelines of {BATCH}, one connection")
