"""The evidence of a soak, kept with its run's directory, so that the verdict can be taken again.

The ledger files are already there; what the soak read from Redis and saw
of the processes at the end (dead-letter entries, deaths, kills, stored
results, leftovers, schedule fires, the cut-off windows) is written next to
them as ``evidence.json``. ``python -m bench soak --judge DIR`` judges it
again, with the verdict as it is now: a rule changed since the run is
checked against real evidence without running the soak again.
"""

from __future__ import annotations

import dataclasses
import json
import os

from .kinds import BY_NAME
from .ledger import read
from .verdict import DeadEntry, Evidence
from .verdict_flows import load as load_flows

EVIDENCE = "evidence.json"
LEDGERS = ("ledger.jsonl", "producer.jsonl")


def save(directory: str, ev: Evidence) -> str:
    path = os.path.join(directory, EVIDENCE)
    data = {
        "kinds": sorted(ev.kinds),
        "dead": [dataclasses.asdict(d) for d in ev.dead],
        "dead_pids": {str(pid): at for pid, at in ev.dead_pids.items()},
        "killed": sorted(ev.killed),
        "results": ev.results,
        "leftovers": ev.leftovers,
        "schedule_fires": ev.schedule_fires,
        "cut_off": [list(window) for window in ev.cut_off],
        "schedule_missed": ev.schedule_missed,
        "flows": ev.flows.to_json() if ev.flows is not None else None,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return path


def load(directory: str) -> Evidence:
    with open(os.path.join(directory, EVIDENCE), encoding="utf-8") as f:
        data = json.load(f)
    return Evidence(
        read([os.path.join(directory, name) for name in LEDGERS]),
        {name: BY_NAME[name] for name in data["kinds"]},
        [DeadEntry(**d) for d in data["dead"]],
        {int(pid): at for pid, at in data["dead_pids"].items()},
        set(data["killed"]),
        data["results"],
        data["leftovers"],
        data["schedule_fires"],
        [(start, end) for start, end in data["cut_off"]],
        schedule_missed=data.get("schedule_missed", {}),
        flows=load_flows(directory, data.get("flows")),
    )
