"""`make bench`: every benchmark in bench/, one after the other, each printing its figures beside the published
or anchor ones. Exit status: non-zero if any benchmark's figures missed its published targets."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHES = ("ttft_table.py", "drift_check.py")


def main() -> int:
    here = Path(__file__).resolve().parent
    worst = 0
    for name in BENCHES:
        path = here / name
        if not path.exists():
            print(f"(skipping {name}: not present)")
            continue
        print(f"\n=== {name} ===", flush=True)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        saved = sys.argv
        sys.argv = [str(path)]
        try:
            worst = max(worst, int(module.main() or 0))
        finally:
            sys.argv = saved
    return worst


if __name__ == "__main__":
    sys.exit(main())
