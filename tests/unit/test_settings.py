"""kvfleet.settings: every KVFLEET_ variable in one model, read when used; bad values, unknown names, the chart
mirror rule, the DAG `fleet` Param's allowed paths, and the generated docs table."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvfleet import settings as S
from kvfleet.errors import PermanentError
from kvfleet.fleet.inventory import load_inventory
from kvfleet.fleet.shared_rules import repo_url_problem
from kvfleet.settings import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "settings.md"


def test_defaults_without_any_variable() -> None:
    s = load_settings({})
    assert (s.fleet, s.poll_seconds, s.timeout_pods_s, s.notify_global, s.kyverno_install, s.debug) == \
        ("fleet.example.yaml", 5.0, 1800.0, "fallback", "refuse", False)


def test_a_secret_url_is_shown_without_its_credentials_path_or_query() -> None:
    for var, value in (("KVFLEET_HISTORY_URL", "postgresql+asyncpg://user:pa/ss@db.internal:5432/kvfleet"),
                       ("KVFLEET_NOTIFY_WEBHOOK_URL", "https://h.example.com:99999/x?token=SECRET"),
                       ("KVFLEET_HELM_REPO_CURVINE", "http://user:SECRETPW@mirror.internal/charts")):
        with pytest.raises(ConfigError) as info:
            load_settings({var: value})
        text = str(info.value)
        assert var in text and not any(s in text for s in ("pa/ss", "SECRET", "user:")), text


@pytest.mark.parametrize(("env", "words"), [
    ({"KVFLEET_POLL_SECONDS": "abc"}, ["KVFLEET_POLL_SECONDS='abc'", "from 0.01 to 300", "unset it", "default: `5`"]),
    ({"KVFLEET_POLL_SECONDS": "0"}, ["KVFLEET_POLL_SECONDS='0'", "from 0.01 to 300"]),
    ({"KVFLEET_TIMEOUT_PODS_S": "-1"}, ["KVFLEET_TIMEOUT_PODS_S='-1'", "from 1 to 86400", "default: `1800`"]),
    ({"KVFLEET_NOTIFY_GLOBAL": "sometimes"}, ["KVFLEET_NOTIFY_GLOBAL='sometimes'", "fallback or always"]),
    ({"KVFLEET_KYVERNO_INSTALL": "maybe"}, ["KVFLEET_KYVERNO_INSTALL='maybe'", "install or refuse"]),
    ({"KVFLEET_DEBUG": "perhaps"}, ["KVFLEET_DEBUG='perhaps'", "true or false"]),
    ({"KVFLEET_NOTIFY_WEBHOOK_URL": "https://hooks.example.com:99999/x?token=s3cret"},
     ["KVFLEET_NOTIFY_WEBHOOK_URL='https://hooks.example.com:99999/…'", "port from 1 to 65535"]),
    ({"KVFLEET_HISTORY_URL": "mysql://writer:pa55word@db.example.com/kvfleet"},
     ["KVFLEET_HISTORY_URL='mysql://db.example.com/…'", "`embedded` or a postgresql:// URL"]),
    ({"KVFLEET_AIRFLOW_URL": "http://[::1/"}, ["KVFLEET_AIRFLOW_URL='http://[::1/'", "http(s)://"]),
    ({"KVFLEET_NOTIFY_SNS_TOPIC_ARN": "kvfleet-topic"}, ["KVFLEET_NOTIFY_SNS_TOPIC_ARN='kvfleet-topic'", "arn:aws:sns:"]),
])
def test_a_bad_value_names_the_variable_the_value_the_range_and_the_fix(env: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    text = str(info.value)
    for word in words:
        assert word in text, text
    assert "s3cret" not in text and "pa55word" not in text
    assert isinstance(info.value, PermanentError)  # a task fails at once, without spending retries


def test_every_bad_variable_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"KVFLEET_POLL_SECONDS": "x", "KVFLEET_NOTIFY_TIMEOUT_S": "600"})
    assert "KVFLEET_POLL_SECONDS" in str(info.value) and "KVFLEET_NOTIFY_TIMEOUT_S='600'" in str(info.value)


def test_history_url_accepts_embedded_and_postgresql() -> None:
    assert load_settings({"KVFLEET_HISTORY_URL": "embedded"}).history_url == "embedded"
    url = "postgresql+psycopg2://kvfleet_writer:pw@127.0.0.1:5432/kvfleet"
    assert load_settings({"KVFLEET_HISTORY_URL": url, "KVFLEET_HISTORY_OWNER_URL": url}).history_owner_url == url
    with pytest.raises(ConfigError, match="KVFLEET_HISTORY_OWNER_URL='embedded'"):
        load_settings({"KVFLEET_HISTORY_OWNER_URL": "embedded"})


def test_an_unknown_variable_is_warned_about_with_the_nearest_name(caplog: pytest.LogCaptureFixture) -> None:
    S._warned.discard("KVFLEET_POLL_SECOND")
    with caplog.at_level(logging.WARNING, logger="kvfleet.settings"):
        load_settings({"KVFLEET_POLL_SECOND": "1", "KVFLEET_SANDBOX_ADMIN": "http://127.0.0.1:1",
                       "KVFLEET_UP_PORT": "8081", "KVFLEET_FAULTS": "1"})
    warned = [r.getMessage() for r in caplog.records]
    assert warned == ["kvfleet: KVFLEET_POLL_SECOND is not a kvfleet setting and is ignored; did you mean "
                      "KVFLEET_POLL_SECONDS? (docs/settings.md lists them)"]
    assert S.unknown_variables({"KVFLEET_XYZZY_QUUX_99": "1"}) == {"KVFLEET_XYZZY_QUUX_99": None}


def test_read_when_used_not_at_import(monkeypatch: pytest.MonkeyPatch, example_fleet: Path) -> None:
    """Modules imported already; a variable set afterwards is what the next context, Param and CLI default see."""
    from kvfleet.airflow import params
    from kvfleet.stages.base import StageContext, Timeouts

    inv = load_inventory(example_fleet)
    monkeypatch.setenv("KVFLEET_TIMEOUT_PODS_S", "42")
    monkeypatch.setenv("KVFLEET_POLL_SECONDS", "0.25")
    monkeypatch.setenv("KVFLEET_FLEET", "/srv/fleet/prod.yaml")
    ctx = StageContext(inventory=inv, cluster=inv.clusters[0], aws_conn_id=None)
    assert (ctx.timeouts.pods_s, ctx.timeouts.cluster_update_s, ctx.poll_s) == (42.0, 3600.0, 0.25)
    assert params.fleet_param().value == "/srv/fleet/prod.yaml"
    assert params.drift_params()["fleet"].value == "/srv/fleet/prod.yaml"
    given = StageContext(inventory=inv, cluster=inv.clusters[0], timeouts=Timeouts(pods_s=7))
    assert given.timeouts.pods_s == 7  # explicit timeouts win
    monkeypatch.setenv("KVFLEET_POLL_SECONDS", "nope")
    with pytest.raises(ConfigError, match="KVFLEET_POLL_SECONDS='nope'"):
        StageContext(inventory=inv, cluster=inv.clusters[0])


def test_a_bad_setting_does_not_hide_the_dags(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from kvfleet.airflow import params

    monkeypatch.setenv("KVFLEET_TIMEOUT_PVC_S", "soon")
    monkeypatch.setenv("KVFLEET_FLEET", "/srv/fleet/prod.yaml")
    assert params.fleet_param().value == "fleet.example.yaml"
    assert "KVFLEET_TIMEOUT_PVC_S='soon'" in caplog.text


def test_the_cli_exits_2_on_a_bad_setting(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from kvfleet.cli import main

    monkeypatch.setenv("KVFLEET_POLL_SECONDS", "-3")
    assert main(["validate"]) == 2
    err = capsys.readouterr().err
    assert "KVFLEET_POLL_SECONDS='-3'" in err and "Traceback" not in err


def test_the_cli_fleet_default_is_read_when_run(monkeypatch: pytest.MonkeyPatch, example_fleet: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from kvfleet.cli import main

    monkeypatch.setenv("KVFLEET_FLEET", str(example_fleet))
    assert main(["validate"]) == 0
    assert f"{example_fleet}: valid" in capsys.readouterr().out


# ---- chart mirrors: the inventory's rule ----------------------------------------------------------------------


@pytest.mark.parametrize("var", ["KVFLEET_HELM_REPO_CURVINE", "KVFLEET_HELM_REPO_KYVERNO"])
def test_an_http_mirror_without_the_allowance_is_refused(var: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({var: "http://charts.internal:8080/curvine"})
    text = str(info.value)
    # a mirror URL may carry credentials: the message shows its scheme, host and port only
    assert text.startswith(f"{var}: 'http://charts.internal:8080/…' is plain http")
    assert "KVFLEET_HELM_REPO_ALLOW_INSECURE=true" in text and f"unset {var}" in text
    allowed = load_settings({var: "http://charts.internal:8080/curvine", "KVFLEET_HELM_REPO_ALLOW_INSECURE": "true"})
    assert getattr(allowed, var.removeprefix("KVFLEET_").lower()) == "http://charts.internal:8080/curvine"
    assert load_settings({var: "https://mirror.example.com/charts"})


@pytest.mark.parametrize("bad", ["ftp://mirror.example.com", "https://user@mirror.example.com",
                                 "https://mirror.example.com/?x=1", "https://mirror.example.com:99999"])
def test_a_malformed_mirror_is_refused_even_with_the_allowance(bad: str) -> None:
    with pytest.raises(ConfigError, match="is not a chart repository URL"):
        load_settings({"KVFLEET_HELM_REPO_CURVINE": bad, "KVFLEET_HELM_REPO_ALLOW_INSECURE": "1"})


def test_the_inventory_and_the_mirrors_share_one_rule() -> None:
    assert repo_url_problem("https://h.example.com:99999", allow_http=False, shown="x", allowance="a")
    assert repo_url_problem("http://h.example.com", allow_http=True, shown="x", allowance="a") is None
    assert "set it" in str(repo_url_problem("http://h.example.com", allow_http=False, shown="x", allowance="set it"))


def test_the_curvine_stage_uses_the_checked_mirror(monkeypatch: pytest.MonkeyPatch, example_fleet: Path) -> None:
    from kvfleet.stages import curvine, kyverno
    from kvfleet.stages.base import StageContext

    inv = load_inventory(example_fleet)
    monkeypatch.setenv("KVFLEET_HELM_REPO_CURVINE", "https://mirror.example.com/curvine")
    ctx = StageContext(inventory=inv, cluster=inv.clusters[0], aws_conn_id=None)
    assert curvine.repo_url(ctx) == "https://mirror.example.com/curvine"
    assert kyverno.repo_url(ctx.settings) == kyverno.REPO
    monkeypatch.setenv("KVFLEET_HELM_REPO_CURVINE", "http://mirror.example.com/curvine")
    with pytest.raises(ConfigError, match="plain http"):
        StageContext(inventory=inv, cluster=inv.clusters[0], aws_conn_id=None)


# ---- the DAG `fleet` Param: configured inventory paths only -----------------------------------------------------


def test_a_run_may_name_only_the_configured_inventory_paths(tmp_path: Path) -> None:
    fleets = tmp_path / "fleets"
    fleets.mkdir()
    (fleets / "prod.yaml").write_text("{}")
    other = tmp_path / "elsewhere.yaml"
    other.write_text("{}")
    (fleets / "escape.yaml").symlink_to(other)
    s = load_settings({"KVFLEET_FLEET": str(fleets / "prod.yaml")})  # default: the directory of KVFLEET_FLEET
    assert s.check_fleet_path(str(fleets / "prod.yaml")) == str(fleets / "prod.yaml")
    for refused in ("/etc/passwd", str(other), str(fleets / "escape.yaml"), str(fleets / ".." / "elsewhere.yaml")):
        with pytest.raises(ConfigError) as info:
            s.check_fleet_path(refused)
        text = str(info.value)
        assert f"fleet: {refused!r} is not one of the configured inventory paths ({fleets})" in text
        assert "KVFLEET_FLEET_PATHS" in text
    listed = load_settings({"KVFLEET_FLEET_PATHS": f"{fleets}:{other}"})
    assert listed.check_fleet_path(str(other)) == str(other)
    assert listed.allowed_fleet_paths == (fleets.resolve(), other.resolve())


def test_the_filesystem_root_is_never_an_allowed_inventory_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative KVFLEET_FLEET in a worker whose working directory is / would otherwise allow every file."""
    monkeypatch.chdir("/")
    s = load_settings({"KVFLEET_FLEET": "fleet.yaml"})
    with pytest.raises(ConfigError, match="include the filesystem root, which allows every file"):
        s.check_fleet_path("/etc/passwd")
    with pytest.raises(ConfigError, match="filesystem root"):
        load_settings({"KVFLEET_FLEET_PATHS": "/srv/fleet:/"}).check_fleet_path("/srv/fleet/a.yaml")


def test_a_dag_task_refuses_a_fleet_param_outside_the_paths(monkeypatch: pytest.MonkeyPatch, example_fleet: Path,
                                                            tmp_path: Path) -> None:
    from kvfleet.airflow.context import pin_inventory

    monkeypatch.setenv("KVFLEET_FLEET_PATHS", str(example_fleet))
    assert len(pin_inventory(str(example_fleet)).sha256) == 64
    secret = tmp_path / "not-an-inventory.yaml"
    secret.write_text("password: hunter2\n")
    with pytest.raises(ConfigError, match="is not one of the configured inventory paths") as info:
        pin_inventory(str(secret))
    assert "hunter2" not in str(info.value)


# ---- docs/settings.md ----------------------------------------------------------------------------------------


def test_the_generated_table_is_up_to_date() -> None:
    text = DOC.read_text()
    assert S.render_doc(text) == text, "docs/settings.md is stale: python -m kvfleet.settings --write docs/settings.md"
    for name in S.known_variables():
        assert f"`{name}`" in text


def test_the_table_changes_when_the_model_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a changed description makes the stored table stale."""
    info = S.Settings.model_fields["poll_seconds"]
    monkeypatch.setattr(info, "description", "something else")
    assert S.render_doc(DOC.read_text()) != DOC.read_text()


def test_every_variable_the_product_reads_is_declared() -> None:
    """No KVFLEET_ name in the product's code is outside the model (the history module, whose rewrite reads the
    same two, included). ``KVFLEET_TIMEOUT_*``-style prefixes in prose end with '_' and are skipped."""
    import re

    declared = set(S.known_variables()) | set(S.NOT_SETTINGS)
    found: set[str] = set()
    for path in (ROOT / "plugins" / "kvfleet").rglob("*.py"):
        found |= {n for n in re.findall(r"\bKVFLEET_[A-Z0-9_]+\b", path.read_text()) if not n.endswith("_")}
    assert found - declared == set()
    assert {"KVFLEET_HISTORY_URL", "KVFLEET_POLL_SECONDS", "KVFLEET_HELM_REPO_CURVINE"} <= found  # it does look
