"""The `kvfleet` command as a user runs it: exit codes, messages, JSON output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.process]


def kvfleet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvfleet.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_validate_example_exits_0(example_fleet: Path) -> None:
    proc = kvfleet("validate", "--fleet", str(example_fleet))
    assert proc.returncode == 0, proc.stderr
    assert "valid — 3 LOBs, 2 clusters, 12 endpoints" in proc.stdout


def test_validate_memory_percent_15_exits_2_naming_path_and_range(example_fleet: Path, tmp_path: Path) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text(example_fleet.read_text().replace("memory_percent: 25", "memory_percent: 15"))
    proc = kvfleet("validate", "--fleet", str(bad))
    assert proc.returncode == 2
    assert "fleet.yaml: clusters.ml-stage-usw2.tiered_storage.memory_percent: 15 is below 20" in proc.stderr
    assert "20–100" in proc.stderr


def test_plan_json_has_clusters_stages_and_waves_canary_first(example_fleet: Path) -> None:
    proc = kvfleet("plan", "--fleet", str(example_fleet), "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert [c["cluster"] for c in plan["clusters"]] == ["ml-prod-use1", "ml-stage-usw2"]
    for c in plan["clusters"]:
        assert c["stages"] == ["tiered_storage", "operator_addons", "curvine"]
        assert c["waves"][0]["kind"] == "canary"
    assert kvfleet("plan", "--fleet", str(example_fleet), "--json").stdout == proc.stdout


def test_plan_unknown_cluster_exits_2(example_fleet: Path) -> None:
    proc = kvfleet("plan", "--fleet", str(example_fleet), "--cluster", "nope")
    assert proc.returncode == 2 and "unknown cluster 'nope'" in proc.stderr


def test_audit_runs_on_an_empty_history(fresh_db_url: str) -> None:
    proc = kvfleet("audit", "runs", "--json", env={"KVFLEET_HISTORY_URL": fresh_db_url})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_audit_bad_since_exits_2(fresh_db_url: str) -> None:
    proc = kvfleet("audit", "runs", "--since", "a week", env={"KVFLEET_HISTORY_URL": fresh_db_url})
    assert proc.returncode == 2 and "not a duration like 7d" in proc.stderr
