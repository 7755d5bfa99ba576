"""How long the test targets take, so the figures in bench/README.md can be checked again.

Runs ``make test`` and ``make e2e`` (or the targets named with ``--targets``) one after another from the checkout,
each with a JUnit report (``PYTEST_ADDOPTS=--junitxml=...``), and reports per target: the wall time, the exit
code, the counts (tests, passed, failed, errors, skipped) and the slowest tests. ``--json`` prints one JSON
document alone on stdout; the targets' own output goes to stderr.

    python bench/suite_time.py --json
    python bench/suite_time.py --targets check --slowest 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("test", "e2e", "check", "lint")


def junit_summary(path: Path, slowest: int) -> dict[str, Any]:
    """Counts and the ``slowest`` test cases of one or more JUnit reports pytest wrote to ``path``."""
    if not path.exists():
        return {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "slowest": []}
    counts = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0}
    cases: list[tuple[float, str]] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        counts["tests"] += 1
        kinds = {child.tag for child in case}
        counts["failed"] += "failure" in kinds
        counts["errors"] += "error" in kinds
        counts["skipped"] += "skipped" in kinds
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        cases.append((float(case.get("time") or 0.0), name))
    passed = counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    top = [{"test": n, "seconds": round(t, 1)} for t, n in sorted(cases, reverse=True)[:slowest]]
    return {**counts, "passed": passed, "slowest": top}


def run_target(target: str, slowest: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvfleet-suite-time-") as tmp:
        report = Path(tmp) / "junit.xml"
        env = dict(os.environ)
        env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} --junitxml={report}".strip()
        started = time.monotonic()
        rc = subprocess.call(["make", target], cwd=ROOT, env=env, stdout=sys.stderr, stderr=sys.stderr)
        wall = time.monotonic() - started
        return {"target": target, "exit_code": rc, "wall_s": round(wall, 1), **junit_summary(report, slowest)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["test", "e2e"], choices=TARGETS,
                        help="make targets to time, in this order (default: test e2e)")
    parser.add_argument("--slowest", type=int, default=10, help="how many of the slowest tests to list (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON document alone on stdout")
    args = parser.parse_args(argv)
    if not 0 <= args.slowest <= 1000:
        parser.error(f"--slowest {args.slowest}: must be between 0 and 1000")
    results = [run_target(t, args.slowest) for t in args.targets]
    if args.json:
        print(json.dumps({"targets": results}, indent=2))
    else:
        for r in results:
            print(f"make {r['target']}: {r['wall_s']:.0f} s, exit {r['exit_code']}; {r['tests']} tests: "
                  f"{r['passed']} passed, {r['failed']} failed, {r['errors']} errors, {r['skipped']} skipped")
            for s in r["slowest"]:
                print(f"  {s['seconds']:7.1f} s  {s['test']}")
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
