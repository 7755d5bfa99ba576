"""`kvfleet freeze on|off|list` and `kvfleet stop`: bad input exits 2 with one line naming the option, the value and
the fix, before the history is touched (KVFLEET_HISTORY_URL points nowhere here), never with a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvfleet import cli


def main(argv: list[str]) -> int:
    """The exit status, whether argparse exits (a parse error) or the command returns."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)

ROOT = Path(__file__).resolve().parents[2]
TWIN = str(ROOT / "tests" / "fleets" / "twin.yaml")


@pytest.fixture(autouse=True)
def _no_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """A history that cannot be reached: a test that got as far as the database would fail, not pass."""
    monkeypatch.setenv("KVFLEET_HISTORY_URL", "postgresql://nobody@127.0.0.1:1/none")
    monkeypatch.setenv("KVFLEET_HISTORY_CONNECT_TIMEOUT_S", "1")


@pytest.mark.parametrize(("argv", "message"), [
    (["freeze"], "the following arguments are required: action"),
    (["freeze", "on", "--all"], "the following arguments are required: --reason"),
    (["freeze", "on", "--reason", "x"], "one of the arguments --lob --cluster --all is required"),
    (["freeze", "off", "--reason", "x", "--lob", "retail", "--all"], "argument --all: not allowed with argument --lob"),
    (["freeze", "on", "--reason", "   ", "--all"], "argument --reason: the reason is required and may not be empty"),
    (["freeze", "on", "--reason", "x" * 501, "--all"], "the reason is 501 characters long: at most 500; shorten it"),
    (["freeze", "on", "--reason", "a\nb", "--all"], "holds a control character (a newline, a tab...)"),
    (["freeze", "on", "--reason", "x", "--all", "--by", ""], "argument --by: the user is required"),
    (["freeze", "on", "--reason", "x", "--run", "kvfleet_rollout/r1"], "kvfleet freeze on: --run: a freeze covers the whole fleet (--all), a LOB (--lob) or a cluster (--cluster), not a run; to halt run kvfleet_rollout/r1: kvfleet stop --run kvfleet_rollout/r1"),
    (["stop", "--reason", "x", "--lob", "retail"], "one of the arguments --run --cluster --all is required"),
    (["stop", "--reason", "x"], "one of the arguments --run --cluster --all is required"),
    (["stop", "--reason", "x", "--run", "no-slash"], "--run 'no-slash' is not a run key dag_id/run_id"),
    (["freeze", "on", "--reason", "x", "--lob", "retial", "--fleet", TWIN],
     "kvfleet freeze on: --lob 'retial' is not a line of business of"),
    (["freeze", "on", "--reason", "x", "--cluster", "ml-prod", "--fleet", TWIN],
     "--cluster 'ml-prod' is not a cluster of"),
    (["stop", "--reason", "x", "--cluster", "ml-prod", "--fleet", TWIN], "kvfleet stop: --cluster 'ml-prod' is not"),
])
def test_bad_input_exits_2_with_one_line_and_prints_nothing(argv: list[str], message: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_cluster_or_lob_lists_the_fleets_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["freeze", "on", "--reason", "x", "--cluster", "nope", "--fleet", TWIN]) == 2
    assert "choose one of: default/us-east-1/ml-prod-use1, default/us-west-2/ml-stage-usw2" in capsys.readouterr().err
    assert main(["freeze", "on", "--reason", "x", "--lob", "nope", "--fleet", TWIN]) == 2
    assert "choose one of: retail, payments, support" in capsys.readouterr().err


def test_no_user_known_asks_for_by(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import getpass

    monkeypatch.delenv("KVFLEET_USER", raising=False)

    def no_login() -> str:
        raise OSError("no passwd entry")

    monkeypatch.setattr(getpass, "getuser", no_login)
    assert main(["freeze", "on", "--reason", "x", "--all"]) == 2
    err = capsys.readouterr().err
    assert "kvfleet freeze on: who is asking is unknown" in err and "pass --by USER" in err
