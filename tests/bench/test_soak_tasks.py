"""The soak's tasks write a run's end line only once the engine knows the run ended (bench/soak/tasks.py)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import django
    django.setup()
    from bench.soak import tasks
    from chasqui_core.engine.jobs.envelope import Job
    from chasqui_core.engine.jobs.registry import JobContext
    from chasqui_core.task_runner import RunContext

    ledger = os.environ["SOAK_LEDGER"]

    class Run:
        '''The run a JobContext reports to: what the ledger held when the engine was told the run ended.'''
        cancel_requested = 0
        seen = None

        def note_end(self):
            with open(ledger) as f:
                Run.seen = [json.loads(line)["e"] for line in f]

    out = {}
    for name, task in (("ok", tasks.ok), ("always_fail", tasks.always_fail)):
        open(ledger, "w").close()
        run = Run()
        ctx = JobContext(Job("job-" + name, task.module_path, [1]), task.queue_name, "w", "1-0", 1, 3, run)
        try:
            task.func(RunContext(task, ctx), 1)
        except Exception:
            pass
        with open(ledger) as f:
            out[name] = {"told_with": Run.seen, "after": [json.loads(line)["e"] for line in f]}
    print(json.dumps(out))
""")


def test_a_soak_task_tells_the_engine_its_run_ended_before_it_writes_the_end_line(tmp_path, redis_url):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.soak.settings", "SOAK_LEDGER": str(tmp_path / "ledger"),
           "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("ok", "always_fail"):
        assert out[name]["told_with"] == ["start"], (name, out[name])  # told after the start, before the end
        assert out[name]["after"] == ["start", "end"], (name, out[name])
