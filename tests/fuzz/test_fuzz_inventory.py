"""Hostile inventories and argument vectors through the real `kvfleet validate`, each in its own fork
with a 1 GiB address-space cap and a CPU cap (tests/fuzz/fuzz_driver.py).

Oracle per case: exit 0 or 2, never a traceback; peak RSS under 200 MB; a case invalid by construction is refused;
a refusal names the mutated field (or, for a document-level refusal, says why the YAML is refused); an accepted
case is valid by :func:`fuzzgen.independent_problems`, a check written apart from kvfleet's validator.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import fuzzgen
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SEEDS = json.loads((ROOT / "tests" / "data" / "fuzz_seeds.json").read_text())
DRIVER = Path(__file__).with_name("fuzz_driver.py")
PEAK_LIMIT_KIB = 200 * 1024


def _argv_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    big = tmp / "big.yaml"
    with big.open("w") as fh:
        fh.write("# filler\n" * (5 * 1024 * 1024 // 9))
    widest = tmp / "widest.yaml"  # just under the size cap, all values: the worst case for the loader's memory
    widest.write_text("x: [" + "1," * (2 * 1024 * 1024 - 8) + "1]\n")
    latin1 = tmp / "latin1.yaml"
    latin1.write_bytes("lobs: [{name: caf\xe9}]\n".encode("latin-1"))
    return [
        ("argv:dev-zero", ["validate", "--fleet", "/dev/zero"], "regular file"),
        ("argv:dev-urandom", ["validate", "--fleet", "/dev/urandom"], "regular file"),
        ("argv:fifo", ["validate", "--fleet", str(fifo)], "regular file"),
        ("argv:directory", ["validate", "--fleet", str(tmp)], "regular file"),
        ("argv:missing", ["validate", "--fleet", str(tmp / "nope.yaml")], "cannot read"),
        ("argv:empty-path", ["validate", "--fleet", ""], "regular file"),  # Path("") is "."
        ("argv:long-path", ["validate", "--fleet", "x" * 5000], "cannot read"),
        ("argv:5MiB", ["validate", "--fleet", str(big)], "4 MiB"),
        ("argv:4MiB-of-values", ["validate", "--fleet", str(widest)], "more than 100000 values"),
        ("argv:latin1", ["validate", "--fleet", str(latin1)], "UTF-8"),
        ("argv:no-value", ["validate", "--fleet"], "--fleet"),
        ("argv:unknown-flag", ["validate", "--flet", "x"], "unrecognized"),
        ("argv:nul-in-path", ["validate", "--fleet", "a\udcffb"], ""),
    ]


def _run(cases: list[dict[str, Any]], tmp: Path) -> dict[str, dict[str, Any]]:
    (tmp / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    proc = subprocess.run([sys.executable, str(DRIVER), str(tmp / "cases.json"), str(tmp / "results.json")],
                          env=env, capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["id"]: r for r in json.loads((tmp / "results.json").read_text())}


def _check(case_id: str, result: dict[str, Any], expect: str, field: str | None,  # noqa: C901 (the oracle)
           text: str | None) -> list[str]:
    out, err = result["stdout"], result["stderr"]
    found = []
    if "Traceback" in out + err:
        found.append("traceback")
    if result["rc"] not in (0, 2):
        found.append(f"exit {result['rc']} signal {result['signal']}")
    if result["maxrss_kib"] > PEAK_LIMIT_KIB:
        found.append(f"peak RSS {result['maxrss_kib']} KiB")
    if result["rc"] == 0:
        if expect == "refuse":
            found.append("accepted an input invalid by construction")
        elif text is not None:
            why = fuzzgen.independent_problems(yaml.safe_load(text))
            if why:
                found.append(f"accepted but invalid: {why}")
    elif result["rc"] == 2:
        if field and expect == "refuse" and field not in err:
            found.append(f"the refusal does not name {field!r}")
        problems = [line for line in err.splitlines() if line.startswith("  - ")]
        if text is not None and not all(re.match(r"  - [^:]+: \S", line) for line in problems):
            found.append("a problem without its file and path")
        if text is not None and "invalid fleet inventory" not in err:
            found.append("no problem list")
        if any(len(line) > 2000 for line in err.splitlines()):
            found.append("an unbounded line in the message")
    return [f"{case_id}: {f} | {err[-400:]!r}" for f in found]


def _inventory_run(count: int, tmp: Path) -> None:
    base = SEEDS["inventory"]["base_seed"]
    seeds = list(range(base, base + count)) + list(SEEDS.get("regressions", []))
    cases: list[dict[str, Any]] = []
    meta: dict[str, tuple[str, str | None, str | None]] = {}
    for seed in seeds:
        case_id, text, expect, field = fuzzgen.inventory_case(seed)
        path = tmp / f"case-{seed}.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        cases.append({"id": case_id, "argv": ["validate", "--fleet", str(path)]})
        meta[case_id] = (expect, field, text)
    for case_id, argv, word in _argv_cases(tmp):
        cases.append({"id": case_id, "argv": argv})
        meta[case_id] = ("refuse", word or None, None)
    results = _run(cases, tmp)
    failures = []
    for case_id, (expect, must_name, doc_text) in meta.items():
        failures += _check(case_id, results[case_id], expect, must_name, doc_text)
    refused = sum(1 for r in results.values() if r["rc"] == 2)
    assert len(results) >= min(count, 300), len(results)
    assert not failures, "\n".join(failures[:30])
    assert refused > len(results) // 2  # the generator mostly builds invalid documents


def test_hostile_inventories_and_argv_are_refused_cleanly(tmp_path: Path) -> None:
    _inventory_run(SEEDS["inventory"]["count"], tmp_path)


@pytest.mark.fuzz_long
@pytest.mark.timeout(1800)
def test_hostile_inventories_long(tmp_path: Path) -> None:
    _inventory_run(SEEDS["inventory"]["long_count"], tmp_path)


def test_the_oracle_can_fail() -> None:
    """The independent check finds what it should in hand-made documents (so an acceptance is really checked)."""
    ok = yaml.safe_load(yaml.safe_dump(fuzzgen.BASE))
    assert fuzzgen.independent_problems(ok) == []
    over = yaml.safe_load(yaml.safe_dump(fuzzgen.BASE))
    over["endpoints"][0]["replicas"] = 9
    assert "GPU capacity of c1" in fuzzgen.independent_problems(over)
    seed = yaml.safe_load(yaml.safe_dump(fuzzgen.BASE))
    seed["settings"]["hash_seed"] = "random"
    assert "hash_seed" in fuzzgen.independent_problems(seed)
    result = {"stdout": "", "stderr": "Traceback (most recent call last):", "rc": 1, "signal": None,
              "maxrss_kib": 300 * 1024}
    assert len(_check("x", result, "refuse", "f", None)) == 3
