"""The benchmark suite still runs end to end (``python -m bench --smoke``).

No timing is checked: only that the scenarios ran, measured something and
wrote it down. The suite starts its own Valkey server, so REDIS_URL is
removed from its environment (the test server's database is not its to flush).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_smoke_writes_positive_rates(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "queue-add", "worker-generic", "--smoke", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(out.read_text())
    assert data["smoke"] is True
    assert data["failures"] == {}
    rows = {(m["label"], m["system"]): m for m in data["measurements"]}
    for scenario in ("queue-add", "worker-generic"):
        row = rows[(scenario, "chasqui")]
        assert row["unit"] == "jobs/s"
        assert len(row["samples"]) == 1
        assert row["median"] > 0, row
        assert row["jobs"] > 0, row
        assert 0 < row["fraction_of_ceiling"], row
    assert data["ceiling_jobs_per_s"] > 0
    assert data["server"]["embedded"] is True
    assert data["server"]["appendonly"] == "no"


def test_bench_rejects_unknown_scenario():
    proc = subprocess.run([sys.executable, "-m", "bench", "no-such-scenario"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown scenario(s) no-such-scenario" in proc.stderr


def test_bench_smoke_measures_the_django_path_beside_its_engine_twin(tmp_path):
    """runworker-async times the real manage.py runworker process and is shown against worker-concurrent."""
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "worker-concurrent", "runworker-async", "django-enqueue-many", "--smoke",
         "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(out.read_text())
    rows = {m["label"]: m for m in data["measurements"] if m["system"] == "chasqui"}
    for label in ("runworker-async", "django-enqueue-many"):
        assert rows[label]["median"] > 0 and not rows[label]["skipped"], rows[label]
    assert "manage.py runworker" in rows["runworker-async"]["note"]
    assert "of worker-concurrent" in proc.stdout  # the twin column
