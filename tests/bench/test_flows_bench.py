"""The workflows' benchmark (``python -m bench flows``) runs end to end: its rows are measured and set against the
plain drain of the same run. No timing is checked; the scenario itself fails when a workflow did not end as it
should (a callback not fired, a job left behind)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench import flows
from tests.helpers import ROOT


def test_bench_flows_measures_batches_and_fan_ins_beside_a_plain_drain(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.run([sys.executable, "-m", "bench", "flows", "--smoke", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(out.read_text())
    assert data["failures"] == {}
    rows = {m["label"]: m for m in data["measurements"]}
    for label in (flows.PLAIN, flows.BATCH, flows.FAN_IN):
        assert rows[label]["unit"] == "jobs/s" and rows[label]["median"] > 0, rows[label]
    for label in (flows.BATCH, flows.FAN_IN):
        assert rows[label]["engine_twin"] == flows.PLAIN and rows[label]["fraction_of_twin"] > 0, rows[label]
        assert "against the plain drain of the same round" in rows[label]["note"]
    checks = rows[flows.CHECKS]
    assert checks["unit"] == "µs" and checks["median"] >= 0 and "% of the" in checks["note"]
