"""``python -m bench [scenario ...] [--json out.json] [--markdown docs/benchmarks.md] [--smoke]``.

``python -m bench soak [--minutes N] ...`` is the accounting soak (bench/soak/): not a benchmark, a run under
faults that must account for every job; it has options of its own, so it is dispatched before the scenarios' parser.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from . import console_scale, report, runner
from .child import PROFILE_DIR_ENV
from .results import BenchError
from .scenarios import BY_NAME, SCENARIOS


def parse(argv: list[str]) -> argparse.Namespace:
    names = ", ".join(s.name for s in SCENARIOS)
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Chasqui's benchmarks. With no scenario (or --all), runs every one. "
                    "Uses a private Valkey server unless REDIS_URL is set.",
        epilog=f"Scenarios: {names}. The accounting soak: python -m bench soak --help.",
    )
    parser.add_argument("scenarios", nargs="*", metavar="scenario", help="scenarios to run (default: all)")
    parser.add_argument("--all", action="store_true", help="run every scenario")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and one repeat: proves the suite works")
    parser.add_argument("--repeats", type=int, default=None, help="measured repeats per scenario (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="also write the results page (docs/benchmarks.md)")
    parser.add_argument("--flush", action="store_true",
                        help="allow emptying a REDIS_URL database that holds keys (the default refuses)")
    parser.add_argument("--profile", metavar="DIR",
                        help="sample every worker process with py-spy into DIR (speedscope files); "
                             "the numbers of a profiled run are not representative")
    parser.add_argument("--console-size", type=int, default=None, metavar="N",
                        help="dead jobs in the console-scale scenario's DLQ (default 1,000,000; 20,000 with --smoke)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)
    unknown = [n for n in args.scenarios if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; the scenarios are: {names}")
    if args.all and args.scenarios:
        parser.error("give scenario names or --all, not both")
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be 1 or more, got {args.repeats}")
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 3
    return args


def _shown(argv: list[str]) -> list[str]:
    """The arguments that shape the results, for the record (where the JSON went does not)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--json", "--profile"):
            skip = True
        elif not arg.startswith(("--json=", "--profile=")):
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["soak"]:
        from .soak.run import main as soak

        return soak(argv[1:])
    args = parse(argv)
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name:<20} {s.summary}")
        return 0
    if args.profile:
        os.environ[PROFILE_DIR_ENV] = os.path.abspath(args.profile)
    if args.console_size is not None:
        if args.console_size < 100:
            print("--console-size must be 100 or more", file=sys.stderr)
            return 2
        os.environ[console_scale.SIZE_ENV] = str(args.console_size)
    selected = [BY_NAME[n] for n in args.scenarios] if args.scenarios else list(SCENARIOS)
    command = "python -m bench" + ("" if not argv else " " + shlex.join(_shown(argv)))
    try:
        run = runner.run(selected, smoke=args.smoke, repeats=args.repeats, url=os.environ.get("REDIS_URL") or None,
                         allow_flush=args.flush, command=command)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    print("\n" + report.table(run))
    goal_lines = report.reach_lines(run)
    if goal_lines:
        print("\nGoals against what this run allowed:\n" + goal_lines)
    print(f"\n{report.summary(run)}\nTook {run.seconds:.1f} s.")
    if args.json:
        report.write_json(run, args.json)
        print(f"Wrote {args.json}")
    if args.markdown:
        report.write_markdown(run, args.markdown)
        print(f"Wrote {args.markdown}")
    if run.failures:
        print(f"\nbench: {len(run.failures)} scenario(s) failed: {', '.join(run.failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
