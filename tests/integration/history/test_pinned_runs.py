"""The inventory a run applies, pinned in the history (revision 0010) on real PostgreSQL: stored once per digest,
read back by the run's later tasks and notifications whatever the file holds by then, refused when missing or
changed, and shown by `kvfleet audit runs`."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from kvfleet import cli
from kvfleet.airflow import notify
from kvfleet.airflow.context import run_inventory, scoped
from kvfleet.errors import InventoryError, PermanentError
from kvfleet.fleet.inventory import InventoryWarning, load_inventory
from kvfleet.fleet.pinning import Pinned, pin
from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.integration
RUN = "kvfleet_rollout/manual__pinned"


def _pin(path: Path) -> Pinned:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InventoryWarning)
        return pin(path)


def _start(history: HistoryRepos, run_key: str, pinned: Pinned | None) -> None:
    dag, _, run_id = run_key.partition("/")
    history.runs.start(run_key, dag_id=dag, run_id=run_id, trigger="manual", triggered_by="ann", params={},
                       inventory=pinned)


def _fleet(tmp_path: Path, example_fleet: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(example_fleet.read_text())
    return path


def test_a_run_reads_the_inventory_it_pinned_not_the_file(history: HistoryRepos, tmp_path: Path,
                                                          example_fleet: Path) -> None:
    fleet = _fleet(tmp_path, example_fleet)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InventoryWarning)
        planned = load_inventory(fleet)
    _start(history, RUN, _pin(fleet))
    doc = yaml.safe_load(fleet.read_text())
    gone = doc["endpoints"].pop()
    doc["endpoints"][0]["replicas"] += 1
    fleet.write_text(yaml.safe_dump(doc))
    assert run_inventory(RUN) == planned
    assert any(e.name == gone["name"] for e in scoped(RUN, clusters=[gone["cluster"]]).endpoints)
    fleet.unlink()  # even a file that is gone
    assert run_inventory(RUN) == planned


def test_a_snapshot_is_stored_once_and_a_cleared_plan_task_pins_again(history: HistoryRepos, tmp_path: Path,
                                                                     example_fleet: Path) -> None:
    fleet = _fleet(tmp_path, example_fleet)
    first = _pin(fleet)
    for n in range(3):
        _start(history, f"kvfleet_drift_check/scheduled__{n}", first)
    _start(history, RUN, first)
    doc = yaml.safe_load(fleet.read_text())
    doc["endpoints"][0]["replicas"] += 1
    fleet.write_text(yaml.safe_dump(doc))
    second = _pin(fleet)
    _start(history, RUN, second)  # the plan task cleared and run again: the new plan applies the new file
    _start(history, RUN, None)  # a task that opens the row without an inventory keeps what was pinned
    with history.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM inventory_snapshots")).scalar_one() == 2
    assert Pinned(**history.runs.pinned(RUN)) == second  # type: ignore[arg-type]
    assert Pinned(**history.runs.pinned("kvfleet_drift_check/scheduled__0")) == first  # type: ignore[arg-type]


def test_a_run_without_a_snapshot_fails_permanently_naming_the_run(history: HistoryRepos) -> None:
    _start(history, RUN, None)
    for run_key in (RUN, "kvfleet_rollout/never-started"):
        with pytest.raises(PermanentError, match=f"run {run_key}: the history store holds no pinned inventory"):
            run_inventory(run_key)


def test_the_database_refuses_a_snapshot_that_is_not_its_digest(history: HistoryRepos, tmp_path: Path,
                                                                example_fleet: Path) -> None:
    pinned = _pin(_fleet(tmp_path, example_fleet))
    _start(history, RUN, pinned)
    with pytest.raises(IntegrityError, match="inventory_snapshots_digest"), history.engine.begin() as conn:
        conn.execute(text("UPDATE inventory_snapshots SET body = body || ' ' WHERE sha256 = :h"),
                     {"h": pinned.sha256})
    with pytest.raises(IntegrityError, match="runs_inventory_commit"), history.engine.begin() as conn:
        conn.execute(text("UPDATE runs SET inventory_commit = 'HEAD' WHERE run_key = :k"), {"k": RUN})


def test_a_changed_snapshot_is_an_inventory_error(history: HistoryRepos, tmp_path: Path,
                                                  example_fleet: Path) -> None:
    """Even past the database's check (an owner who dropped it): the digest is checked again when read."""
    pinned = _pin(_fleet(tmp_path, example_fleet))
    _start(history, RUN, pinned)
    with history.engine.begin() as conn:
        conn.execute(text("ALTER TABLE inventory_snapshots DROP CONSTRAINT inventory_snapshots_digest"))
        conn.execute(text("UPDATE inventory_snapshots SET body = replace(body, :was, :now)"),
                     {"was": '"replicas":2', "now": '"replicas":3'})
    with pytest.raises(InventoryError, match="does not match its digest"):
        run_inventory(RUN)


def test_notifications_route_by_the_pinned_inventory(history: HistoryRepos, tmp_path: Path, example_fleet: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    fleet = _fleet(tmp_path, example_fleet)
    _start(history, RUN, _pin(fleet))
    fleet.write_text("lobs: []\n")
    inventory = notify.load_fleet(RUN, history)
    assert inventory is not None and {lob.name for lob in inventory.lobs} == {
        lob["name"] for lob in yaml.safe_load(example_fleet.read_text())["lobs"]}
    # Airflow's logging set-up (loaded by an earlier test in this worker) may stop kvfleet's loggers propagating.
    monkeypatch.setattr(logging.getLogger("kvfleet.airflow.notify"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="kvfleet.airflow.notify"):
        assert notify.load_fleet("kvfleet_rollout/never-started", history) is None
    assert "has no pinned inventory" in caplog.text
    dag_run = SimpleNamespace(dag_id="kvfleet_rollout", run_id="manual__pinned")
    assert notify._run_key({"dag_run": dag_run}) == RUN


def test_audit_runs_shows_the_digest_and_the_commit(history: HistoryRepos, tmp_path: Path, example_fleet: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pinned = _pin(_fleet(tmp_path, example_fleet))
    committed = Pinned(pinned.body, pinned.sha256, pinned.source, commit="ab" * 20, dirty=True)
    _start(history, RUN, committed)
    _start(history, "kvfleet_rollout/manual__old", None)
    assert cli.main(["audit", "runs", "--json"]) == 0
    rows = {r["run_key"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows[RUN]["inventory_sha256"], rows[RUN]["inventory_commit"], rows[RUN]["inventory_dirty"]) == (
        pinned.sha256, "ab" * 20, True)
    assert rows["kvfleet_rollout/manual__old"]["inventory_sha256"] is None
    assert cli.main(["audit", "runs"]) == 0
    table = capsys.readouterr().out
    assert f"{pinned.sha256[:12]}@{'ab' * 6}+dirty" in table


def test_audit_inventory_prints_what_a_run_applied(history: HistoryRepos, tmp_path: Path, example_fleet: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pinned = _pin(_fleet(tmp_path, example_fleet))
    _start(history, RUN, pinned)
    assert cli.main(["audit", "inventory", "--run", RUN, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)  # JSON alone on stdout
    assert (shown["sha256"], shown["source"], shown["commit"]) == (pinned.sha256, "fleet.yaml", None)
    assert shown["inventory"] == json.loads(pinned.body)
    assert cli.main(["audit", "inventory", "--run", RUN]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# run {RUN}: fleet.yaml sha256:{pinned.sha256}\n") and '"clusters": [' in out
    assert cli.main(["audit", "inventory", "--run", "kvfleet_rollout/never"]) == 1
    assert "has no pinned inventory" in capsys.readouterr().err
    assert cli.main(["audit", "inventory"]) == 2
    assert "--run is required" in capsys.readouterr().err


def test_a_refused_plan_has_pinned_its_inventory_first(history: HistoryRepos, tmp_path: Path, example_fleet: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan refused for its scope (an unknown LOB) has already pinned the inventory, so the run's failure
    notification routes by it."""
    from airflow.sdk.exceptions import AirflowFailException
    from airflow.sdk.execution_time.context import set_current_context

    from kvfleet.airflow import rollout

    fleet = _fleet(tmp_path, example_fleet)
    monkeypatch.setenv("KVFLEET_FLEET_PATHS", str(tmp_path))
    dag_run = SimpleNamespace(dag_id="kvfleet_rollout", run_id="manual__pinned", run_type="manual",
                              triggering_user_name="ann")
    with set_current_context({"dag_run": dag_run, "ti": SimpleNamespace(task_id="plan", map_index=-1)}), \
            pytest.raises(AirflowFailException, match="unknown lob 'nope'"):  # type: ignore[typeddict-item]
        rollout.plan_rollout({"fleet": str(fleet), "lobs": ["nope"]})
    assert history.runs.pinned(RUN) is not None
    assert notify.load_fleet(RUN, history) == _pin_inv(fleet)


def _pin_inv(path: Path) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InventoryWarning)
        return load_inventory(path)
