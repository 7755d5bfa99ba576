"""`make bench`: every benchmark in bench/, one after the other, each printing its figures beside the published
or anchor ones. Each runs in its own interpreter (its own sandbox, nothing shared). Exit status: non-zero if any
benchmark's figures missed its published targets, or if one could not run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BENCHES = ("ttft_table.py", "drift_check.py", "rollout_availability.py", "parse_time.py", "audit_scale.py",
           "drift_latency.py", "probe_footprint.py", "fleet_scale.py")


def main() -> int:
    here = Path(__file__).resolve().parent
    worst = 0
    for name in BENCHES:
        print(f"\n=== {name} ===", flush=True)
        started = time.monotonic()
        code = subprocess.call([sys.executable, str(here / name)])
        print(f"=== {name}: exit {code} after {time.monotonic() - started:.0f}s ===", flush=True)
        worst = max(worst, code if code > 0 else int(code != 0))  # killed by a signal: negative, a failure
    return worst


if __name__ == "__main__":
    sys.exit(main())
