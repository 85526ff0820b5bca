"""The machine a run happened on; a number without its machine means little."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, str | int]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "usable_cores": usable,
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "redis_py": _version("redis"),
        "hiredis": _version("hiredis"),
        "msgpack": _version("msgpack"),
        "executable": sys.executable,
        "load_at_start": load,
    }


def describe(info: dict) -> str:
    return (f"{info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), {info['python']}, "
            f"redis-py {info['redis_py']}, hiredis {info['hiredis']}, {info['os']}; "
            f"load average at start {info['load_at_start']}")


def proc_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far, as the kernel counts it (in clock ticks)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
