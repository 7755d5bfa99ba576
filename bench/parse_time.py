"""Parse time of each DAG file over ``import airflow.sdk`` (issue 19): target < 50 ms.

Each sample is a fresh interpreter that imports ``airflow.sdk`` and then runs the DAG file (``runpy.run_path``),
timing only the second part, in wall time and in the process's CPU time (CPU time is what the file costs; wall
time also counts waiting for a core on a loaded machine). The figure is the median of ``--runs`` (7) samples.

Beside the kvfleet files, a *reference* DAG with no kvfleet import at all (``@dag`` with a schedule and a Param,
two ``@task``s, one mapped) is timed the same way: it is what Airflow's own lazily imported decorators, operators
and timetables cost the first DAG file an interpreter parses. ``kvfleet share`` = file − reference. Each sample
also lists the heavy modules the file loaded (none expected: kubernetes, botocore, boto3, kvfleet.stages,
kvfleet.clients, kvfleet.history).

    python bench/parse_time.py [--runs 7] [--json]

Exit 0 when every DAG file's median CPU time over ``import airflow.sdk`` is under the target and no heavy module
was loaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DAGS = sorted((ROOT / "dags").glob("*.py"))
TARGET_MS = 50.0
HEAVY = ("kubernetes", "botocore", "boto3", "kvfleet.stages", "kvfleet.clients", "kvfleet.history")

PROBE = r"""
import json, runpy, sys, time
import airflow.sdk  # noqa: F401
before = set(sys.modules)
w0, c0 = time.perf_counter(), time.process_time()
runpy.run_path(sys.argv[1])
w1, c1 = time.perf_counter(), time.process_time()
roots = json.loads(sys.argv[2])
heavy = sorted({m for m in set(sys.modules) - before for h in roots if m == h or m.startswith(h + ".")})
print("PARSE=" + json.dumps({"wall_ms": 1000 * (w1 - w0), "cpu_ms": 1000 * (c1 - c0), "heavy": heavy}))
"""

REFERENCE_DAG = '''
from datetime import datetime, timedelta

from airflow.sdk import Param, dag, task


@dag(dag_id="parse_time_reference", schedule=timedelta(minutes=10), start_date=datetime(2026, 1, 1),
     catchup=False, params={"n": Param(1, type="integer", minimum=0, maximum=9, description="a number")},
     tags=["bench"])
def parse_time_reference():
    @task
    def scope(params=None):
        return [1, 2]

    @task
    def each(x):
        return x

    each.expand(x=scope())


parse_time_reference()
'''


def sample(path: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(path), json.dumps(HEAVY)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{path.name} did not parse: {proc.stderr[-2000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("PARSE=")][-1]
    return dict(json.loads(line[len("PARSE="):]))


def measure(path: Path, runs: int) -> dict[str, Any]:
    samples = [sample(path) for _ in range(runs)]
    return {"wall_ms": round(statistics.median(s["wall_ms"] for s in samples), 1),
            "cpu_ms": round(statistics.median(s["cpu_ms"] for s in samples), 1),
            "heavy": sorted({m for s in samples for m in s["heavy"]}),
            "samples_cpu_ms": [round(s["cpu_ms"], 1) for s in samples]}


def run(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        ref_path = Path(tmp) / "parse_time_reference.py"
        ref_path.write_text(REFERENCE_DAG)
        reference = measure(ref_path, runs)
    files: dict[str, Any] = {}
    for path in DAGS:
        figures = measure(path, runs)
        figures["kvfleet_share_cpu_ms"] = round(figures["cpu_ms"] - reference["cpu_ms"], 1)
        figures["ok"] = figures["cpu_ms"] < TARGET_MS and not figures["heavy"]
        files[path.name] = figures
    return {"runs": runs, "target_ms": TARGET_MS, "reference": reference, "files": files,
            "ok": all(f["ok"] for f in files.values())}


def print_table(result: dict[str, Any]) -> None:
    print(f"DAG parse time over `import airflow.sdk`, median of {result['runs']} fresh interpreters "
          f"(target < {result['target_ms']:.0f} ms)")
    print(f"{'file':34} {'cpu ms':>7} {'wall ms':>8} {'kvfleet share':>14}  heavy modules")
    ref = result["reference"]
    print(f"{'(reference DAG, no kvfleet)':34} {ref['cpu_ms']:7.1f} {ref['wall_ms']:8.1f} {'':>14}")
    for name, f in result["files"].items():
        mark = "✓" if f["ok"] else "✗"
        print(f"{name:34} {f['cpu_ms']:7.1f} {f['wall_ms']:8.1f} {f['kvfleet_share_cpu_ms']:13.1f}  "
              f"{', '.join(f['heavy']) or 'none'} {mark}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per file (default 7)")
    parser.add_argument("--json", action="store_true", help="print only the results, as JSON")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 100:
        parser.error(f"--runs {args.runs}: must be 1 to 100")
    result = run(args.runs)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
