"""The text of kvfleet's human gates (kvfleet.airflow.gates): a readable subject and a body with the evidence."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kvfleet.airflow import gates
from kvfleet.fleet import gates as fleet_gates

ROOT = Path(__file__).resolve().parents[2]
RUN = "kvfleet_rollout/manual__2026-12-01T10:00:00+00:00"
LINKS = gates.Links(page="https://airflow.example.com/kvfleet", runbook="https://git.example.com/kvfleet/docs/runbook.md")
WAVE = {"cluster": "ml-prod-use1", "waves": [2], "review": ["llm/chat-b"],
        "endpoints": {"llm/chat-a": "pass", "llm/chat-b": "degraded — warm TTFT | slow proxy",
                      "llm/chat-c": "fail — pods not ready after 1800 s"}}
VERIFS: list[dict[str, Any]] = [
    {"endpoint": "llm/chat-a", "lob": "search", "verdict": "fail", "hit_ratio": 0.1, "speedup": 1.0,
     "expected_speedup": 2.7, "at": "2026-12-01T10:04:00+00:00", "run_key": RUN},  # older: superseded
    {"endpoint": "llm/chat-a", "lob": "search", "verdict": "pass", "hit_ratio": 1.0, "speedup": 2.61,
     "expected_speedup": 2.7, "at": "2026-12-01T10:05:00+00:00", "run_key": RUN},
    {"endpoint": "llm/chat-b", "lob": "ads", "verdict": "degraded", "hit_ratio": 1.0, "speedup": 1.12,
     "expected_speedup": 2.7, "diagnosis": "warm TTFT | slow proxy", "at": "2026-12-01T10:06:00+00:00",
     "run_key": RUN},
]
DRIFT = [{"cluster": "ml-prod-use1", "kind": "operator_paused", "severity": "high", "object_ref": "deploy/op",
          "field": "spec.replicas", "expected": "1", "actual": "0",
          "first_seen": datetime(2026, 12, 1, 9, 0, tzinfo=UTC)},
         {"cluster": "other-cluster", "kind": "lmcache_config", "severity": "low", "endpoint": "x/y",
          "first_seen": datetime(2026, 12, 1, 9, 0, tzinfo=UTC)}]


def review_text(**kw: Any) -> gates.GateText:
    args: dict[str, Any] = {"asked": fleet_gates.ASK_REVIEW, "run_key": RUN, "wave": WAVE, "verifications": VERIFS,
                            "open_drift": DRIFT, "reason": "verification inconclusive", "tolerance": 0.25,
                            "timeout": timedelta(hours=2), "links": LINKS}
    return gates.wave_gate_text(**{**args, **kw})


def table_rows(body: str, first_cell: str) -> list[list[str]]:
    rows = []
    for line in body.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells and cells[0] == first_cell:
            rows.append(cells)
    return rows


def test_review_subject_names_cluster_wave_count_question_and_run_without_a_list_repr() -> None:
    subject = review_text().subject
    assert subject.startswith("kvfleet rollout ml-prod-use1 wave 2: 1 of 3 endpoints inconclusive, 1 open drift")
    assert "approve, skip them, or abort?" in subject
    assert "(manual 2026-12-01 10:00)" in subject
    assert "[" not in subject and "'" not in subject and "\n" not in subject
    assert len(subject) <= gates.SUBJECT_MAX


def test_canary_wave_is_called_canary() -> None:
    text = review_text(wave={**WAVE, "waves": [0]}, slot=0)
    assert "wave 0 (canary)" in text.subject and "**wave 0 (canary)**" in text.body


def test_review_body_has_each_endpoint_with_its_newest_verification_against_the_bar() -> None:
    body = review_text().body
    (a,) = table_rows(body, "`llm/chat-a`")
    assert a[1:7] == ["search", "pass", "1.00", "2.61×", "2.03×", "2.70×"]  # bar = 2.7 × (1 − 0.25) = 2.025
    (b,) = table_rows(body, "`llm/chat-b`")
    assert b[2] == "⚠ degraded" and b[4] == "1.12× ⬇"  # below the bar is marked
    assert b[7] == "warm TTFT \\| slow proxy"  # a pipe in a diagnosis does not break the table
    (c,) = table_rows(body, "`llm/chat-c`")  # failed before it could be verified: its row comes from the wave
    assert c[2] == "**FAIL**" and c[3] == "–" and c[7] == "pods not ready after 1800 s"


def test_the_bar_follows_the_tolerance() -> None:
    (a,) = table_rows(review_text(tolerance=0.1).body, "`llm/chat-a`")  # below the default: a tighter bar
    assert a[5] == "2.43×"  # 2.7 × (1 − 0.1)


def test_body_shows_the_open_drift_of_this_cluster_only() -> None:
    body = review_text().body
    (d,) = table_rows(body, "operator_paused")
    assert d[1:] == ["high", "deploy/op", "spec.replicas", "1", "0", "2026-12-01 09:00 UTC"]
    assert "lmcache_config" not in body
    assert "_No open drift._" in review_text(open_drift=[]).body


def test_body_says_what_each_option_does_and_the_timeout_default() -> None:
    body = review_text().body
    for option in fleet_gates.REVIEW_OPTIONS:
        assert f"- **{option}**: " in body
    assert "If nobody answers within 2 h, the gate takes **Abort**." in body


def test_approval_gate_asks_approve_or_reject() -> None:
    wave = {"cluster": "ml-prod-use1", "waves": [0], "endpoints": {"llm/chat-a": "pass", "llm/chat-b": "pass"}}
    text = review_text(asked=fleet_gates.ASK_APPROVAL, wave=wave, slot=0, open_drift=[])
    assert text.subject.startswith("kvfleet rollout ml-prod-use1 wave 0 (canary): 2/2 endpoints verified — "
                                   "approve the next wave?")
    for option in fleet_gates.APPROVAL_OPTIONS:
        assert f"- **{option}**: " in text.body
    assert "the gate takes **Reject**" in text.body


def test_links_to_the_page_and_the_runbook_sections_that_exist() -> None:
    body = review_text().body
    assert "[Fleet view of this cluster](https://airflow.example.com/kvfleet/fleet?cluster=ml-prod-use1)" in body
    assert "https://airflow.example.com/kvfleet/gates?run_key=kvfleet_rollout%2Fmanual__" in body
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", runbook, flags=re.M)}
    for anchor in gates.RUNBOOK_ANCHORS.values():
        assert anchor in anchors, f"runbook has no heading for #{anchor}"
    assert f"docs/runbook.md#{gates.RUNBOOK_ANCHORS['verification']}" in body
    assert "](" not in review_text(links=gates.Links()).body  # no configured URL: no dead link


def test_pass_rule_matches_the_verification_stage() -> None:
    from kvfleet.stages import verify

    assert (gates.PASS_HIT_RATIO, gates.SPEEDUP_TOLERANCE) == (verify.PASS_HIT_RATIO, verify.SPEEDUP_TOLERANCE)


def test_curvine_approval_subject_and_preflight_table() -> None:
    diff = "--- before\n+++ after\n-image: 0.3.2\n+image: 0.3.3\n+extra: 1\n"
    text = gates.curvine_approval_text(
        run_key="kvfleet_curvine_upgrade/manual__2026-12-01T11:00:00+00:00", version="0.3.3-alpha",
        clusters=["ml-prod-use1"], open_drift=DRIFT, timeout=timedelta(hours=24), links=LINKS,
        preflight=[{"cluster": "ml-prod-use1", "outcome": "planned", "revision": 4, "chart_version": "0.3.2-alpha",
                    "command": "helm upgrade curvine curvine/curvine -f values.yaml", "diff": diff}])
    assert text.subject == ("kvfleet Curvine upgrade to 0.3.3-alpha on ml-prod-use1, 1 open drift — approve? "
                            "(manual 2026-12-01 11:00)")
    (row,) = table_rows(text.body, "`ml-prod-use1`")
    assert row[1:4] == ["4 · 0.3.2-alpha", "planned", "+2 −1 lines"]
    assert "stays **false**" in text.body and "the gate takes **Reject**" in text.body
    assert "within 24 h" in text.body
    assert "#4-curvine-upgrade-kvfleet_curvine_upgrade-on-demand" in text.body


def test_many_clusters_shorten_the_subject() -> None:
    names = [f"cluster-{i:02d}" for i in range(30)]
    text = gates.curvine_approval_text(run_key="d/scheduled__2026-12-01T00:00:00+00:00", version="1.0",
                                       clusters=names, preflight=[])
    assert "+26 more" in text.subject and len(text.subject) <= gates.SUBJECT_MAX


@pytest.mark.parametrize(("dag_id", "run_id", "task_id", "index", "want"), [
    ("kvfleet_rollout", "manual__2026-12-01T10:00:00+00:00", "cluster.gate_0", 1,
     "https://af/dags/kvfleet_rollout/runs/manual__2026-12-01T10%3A00%3A00%2B00%3A00/tasks/cluster.gate_0/mapped/1"
     "/required_actions"),
    ("kvfleet_curvine_upgrade", "r1", "approve", -1,
     "https://af/dags/kvfleet_curvine_upgrade/runs/r1/tasks/approve/required_actions"),
])
def test_required_actions_url(dag_id: str, run_id: str, task_id: str, index: int, want: str) -> None:
    assert gates.required_actions_url("https://af/", dag_id, run_id, task_id, index) == want
