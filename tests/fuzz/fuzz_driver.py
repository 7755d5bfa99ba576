"""Run many `kvfleet` argument vectors, each in a fresh fork with a memory cap, a CPU cap and a wall-clock alarm.

Usage: ``python fuzz_driver.py CASES.json RESULTS.json`` where CASES is a list of ``{"id", "argv"}``. For each case
the child sets ``RLIMIT_AS`` (``--mem-mib``, default 1024) and ``RLIMIT_CPU``, sends its stdout/stderr to files, and
runs ``kvfleet.cli.main(argv)``; the parent reads the child's own peak RSS from ``os.wait4`` (``ru_maxrss``, KiB on
Linux). The results are ``{"id", "rc", "signal", "maxrss_kib", "stdout", "stderr", "seconds"}``.

The product code is imported once, before the forks, so a case costs a fork rather than an interpreter start.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import tempfile
import time
from typing import Any

MEM_MIB = 1024
CPU_S = 20
WALL_S = 30
OUTPUT_KEEP = 20_000


def _child(argv: list[str], out: str, err: str, mem_mib: int) -> None:
    try:
        resource.setrlimit(resource.RLIMIT_AS, (mem_mib * 1024 * 1024, mem_mib * 1024 * 1024))
        resource.setrlimit(resource.RLIMIT_CPU, (CPU_S, CPU_S + 1))
        signal.alarm(WALL_S)
        fo = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        fe = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fo, 1)
        os.dup2(fe, 2)
        from kvfleet.cli import main

        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's own refusals
            rc = exc.code if isinstance(exc.code, int) else 2
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(rc))
    except BaseException:  # a traceback here is a finding: print it where the oracle looks
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(70)


def run(cases: list[dict[str, Any]], mem_mib: int = MEM_MIB) -> list[dict[str, Any]]:
    import kvfleet.cli  # noqa: F401  (imported once, before the forks)

    results = []
    with tempfile.TemporaryDirectory(prefix="kvfleet-fuzz-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        for case in cases:
            start = time.monotonic()
            pid = os.fork()
            if pid == 0:
                _child(case["argv"], out, err, mem_mib)
            _, status, usage = os.wait4(pid, 0)
            with open(out, errors="replace") as fh:
                stdout = fh.read(OUTPUT_KEEP)
            with open(err, errors="replace") as fh:
                stderr = fh.read(OUTPUT_KEEP)
            results.append({
                "id": case["id"],
                "rc": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "maxrss_kib": usage.ru_maxrss,
                "stdout": stdout,
                "stderr": stderr,
                "seconds": round(time.monotonic() - start, 3),
            })
    return results


def main() -> int:
    cases_path, results_path = sys.argv[1], sys.argv[2]
    mem = int(sys.argv[3]) if len(sys.argv) > 3 else MEM_MIB
    with open(cases_path) as fh:
        cases = json.load(fh)
    with open(results_path, "w") as fh:
        json.dump(run(cases, mem), fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
