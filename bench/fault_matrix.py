"""Benchmark: the fault matrix as a table, steps x faults -> invariants held.

Runs tests/faults (the whole matrix with KVFLEET_FAULTS=1, or only the always-run slice with ``--slice``) in a
pytest subprocess against a fresh sandbox; every case appends its result (invariants, evidence, wall time) to a
JSON-lines file; then prints the table (text) or the results (``--json``).

    python bench/fault_matrix.py [--slice] [--json] [-k EXPR]

Exit 0 when every case ran and every invariant held (cases marked as known product bugs count as not held and
are listed), 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "faults"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slice", action="store_true", help="only the always-run slice (one case per step/fault)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("-k", dest="expr", default=None, help="pytest -k expression narrowing the cases")
    args = parser.parse_args(argv)

    from faultkit import INVARIANTS, table

    with tempfile.TemporaryDirectory(prefix="kvfleet-faults-") as tmp:
        out = Path(tmp) / "results.jsonl"
        env = {**os.environ, "KVFLEET_FAULT_MATRIX_OUT": str(out), "KVFLEET_FAULTS": "0" if args.slice else "1",
               "PATH": f"{ROOT / '.tools' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", str(ROOT / "tests" / "faults")]
        if args.expr:
            cmd += ["-k", args.expr]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        results: list[dict[str, Any]] = []
        if out.exists():
            results = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    ok = proc.returncode == 0 and bool(results) and all(r["held"] for r in results)
    if args.json:
        print(json.dumps({"cases": len(results), "all_held": ok, "wall_s": round(wall, 1),
                          "invariants": list(INVARIANTS), "pytest": summary, "results": results},
                         indent=1, default=str))
    else:
        print(table(results) if results else "no case ran")
        print(f"\n{len(results)} cases, {sum(r['held'] for r in results)} with every invariant held "
              f"({', '.join(INVARIANTS)}); pytest: {summary}; {wall:.0f} s")
    if proc.returncode not in (0, 1) or not results:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
