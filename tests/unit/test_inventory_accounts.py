"""A fleet across AWS accounts: the inventory declares `accounts`, each cluster is known by its key
account/region/name (kvfleet.fleet.cluster_ref), and a cluster name two accounts share stays two clusters.
tests/fleets/multi-account.yaml has two LOB accounts with a cluster named ml-prod each, and a shared-services
account in another region."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet import cli
from kvfleet.errors import InventoryError
from kvfleet.fleet.cluster_ref import ClusterRef
from kvfleet.fleet.inventory import load_inventory, parse_inventory
from kvfleet.fleet.plan import make_plan

FLEET = Path(__file__).resolve().parents[1] / "fleets" / "multi-account.yaml"
RETAIL, PAYMENTS = "111111111111/us-east-1/ml-prod", "222222222222/us-east-1/ml-prod"


def _doc() -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load(FLEET.read_text()))


def _problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(InventoryError) as info:
        parse_inventory(yaml.safe_dump(doc))
    return list(info.value.problems)


def test_two_clusters_named_ml_prod_are_two_clusters() -> None:
    inv = load_inventory(FLEET)
    assert [c.key for c in inv.clusters] == [RETAIL, PAYMENTS, "333333333333/us-west-2/ml-eval"]
    assert inv.clusters[0].ref == ClusterRef("111111111111", "us-east-1", "ml-prod")
    # each endpoint is on the cluster of its LOB's account, or the one its key names
    on = {e.name: next(c.key for c in inv.clusters if e.on(c)) for e in inv.endpoints}
    assert on == {"storefront-chat": RETAIL, "catalog-rag": RETAIL, "disputes-rag": PAYMENTS,
                  "chargebacks": PAYMENTS, "eval-chat": "333333333333/us-west-2/ml-eval"}
    assert [e.name for e in inv.endpoints_of(PAYMENTS)] == ["disputes-rag", "chargebacks"]
    assert inv.cluster("retail-prod/us-east-1/ml-prod").key == RETAIL  # the account's inventory name works too
    assert inv.cluster("ml-eval").key.startswith("333333333333/")  # a bare name only one cluster has
    with pytest.raises(InventoryError, match=rf"'ml-prod' names 2 clusters \({RETAIL}, {PAYMENTS}\)"):
        inv.cluster("ml-prod")
    with pytest.raises(InventoryError, match="names 2 clusters"):
        inv.select(clusters=["ml-prod"])
    narrowed = inv.select(clusters=[PAYMENTS])
    assert [c.key for c in narrowed.clusters] == [PAYMENTS] and len(narrowed.endpoints) == 2


def test_a_fleet_without_accounts_is_in_the_base_identity_s_account(example_fleet: Path) -> None:
    inv = load_inventory(example_fleet)
    assert [c.key for c in inv.clusters] == ["default/us-east-1/ml-prod-use1", "default/us-west-2/ml-stage-usw2"]
    assert inv.cluster("ml-prod-use1") is inv.clusters[0]


def test_validate_and_plan_show_both_clusters_by_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "--fleet", str(FLEET), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [c["key"] for c in shown["clusters"]] == [RETAIL, PAYMENTS, "333333333333/us-west-2/ml-eval"]
    assert cli.main(["plan", "--fleet", str(FLEET), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    refs = {c["key"]: sorted(e["name"] for w in c["waves"] for e in w["endpoints"]) for c in plan["clusters"]}
    assert refs == {RETAIL: ["catalog-rag", "storefront-chat"], PAYMENTS: ["chargebacks", "disputes-rag"],
                    "333333333333/us-west-2/ml-eval": ["eval-chat"]}
    assert make_plan(load_inventory(FLEET)).clusters[1].key == RETAIL  # sorted by name, then key


def _unknown_account(d: dict[str, Any]) -> None:
    d["clusters"][2]["account"] = "nope"


def _duplicate_name(d: dict[str, Any]) -> None:
    d["accounts"]["payments-prod"] = {**d["accounts"]["payments-prod"], "name": "retail-prod"}


def _duplicate_id(d: dict[str, Any]) -> None:
    d["accounts"]["shared-services"]["id"] = "111111111111"


def _unquoted_id(d: dict[str, Any]) -> None:
    d["accounts"]["retail-prod"]["id"] = 111111111111


def _short_id(d: dict[str, Any]) -> None:
    d["accounts"]["retail-prod"]["id"] = "11111111111"


def _bad_role(d: dict[str, Any]) -> None:
    d["accounts"]["retail-prod"]["role_arn"] = "arn:aws:iam::111111111111:user/kvfleet"


def _foreign_role(d: dict[str, Any]) -> None:
    d["accounts"]["retail-prod"]["role_arn"] = "arn:aws:iam::999999999999:role/kvfleet"


def _no_role(d: dict[str, Any]) -> None:
    del d["accounts"]["retail-prod"]["role_arn"]


def _bad_external_id(d: dict[str, Any]) -> None:
    d["accounts"]["retail-prod"]["external_id"] = "x"


def _unquoted_external_id(d: dict[str, Any]) -> None:
    d["accounts"]["retail-prod"]["external_id"] = 123456  # YAML: an unquoted 0123456 would be octal


def _short_session(d: dict[str, Any]) -> None:
    d["accounts"]["payments-prod"]["session_duration_s"] = 60


def _ambiguous(d: dict[str, Any]) -> None:
    del d["lobs"][0]["account"]  # retail's endpoints say `cluster: ml-prod`, which two accounts have


def _unknown_lob_account(d: dict[str, Any]) -> None:
    d["lobs"][2]["account"] = "nope"


@pytest.mark.parametrize(("mutate", "expected"), [
    (_unknown_account, "clusters.ml-eval.account: 'nope' is not a declared account; declared: payments-prod, "
                       "retail-prod, shared-services"),
    (_unknown_lob_account, "lobs.platform.account: 'nope' is not a declared account"),
    (_duplicate_name, "duplicate account 'retail-prod'"),
    (_duplicate_id, "accounts.shared-services.id: 111111111111 is also the id of accounts.retail-prod"),
    (_unquoted_id, "accounts.retail-prod.id: 111111111111 is an integer, not a string; write the 12-digit account "
                   "id quoted"),
    (_short_id, "accounts.retail-prod.id: '11111111111' is not a 12-digit AWS account id"),
    (_bad_role, "accounts.retail-prod.role_arn: 'arn:aws:iam::111111111111:user/kvfleet' is not an IAM role ARN"),
    (_foreign_role, "accounts.retail-prod.role_arn: 'arn:aws:iam::999999999999:role/kvfleet' is a role of account "
                    "999999999999, not of 111111111111"),
    (_no_role, "clusters[0](ml-prod).account: retail-prod: account 111111111111 has neither role_arn nor "
               "aws_conn_id"),
    (_bad_external_id, "accounts.retail-prod.external_id: 'x' is not an STS external id"),
    (_short_session, "accounts.payments-prod.session_duration_s: 60 is below 900"),
    (_unquoted_external_id, "accounts.retail-prod.external_id: 123456 is an integer, not a string; quote it"),
    (_ambiguous, f"endpoints[0](storefront-chat).cluster: 'ml-prod' names 2 clusters ({RETAIL}, {PAYMENTS})"),
])
def test_a_bad_account_is_refused_naming_the_field(mutate: Any, expected: str) -> None:
    doc = _doc()
    mutate(doc)
    problems = _problems(doc)
    assert any(expected in p for p in problems), problems


def test_the_cli_refuses_a_bad_account_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc()
    _foreign_role(doc)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["validate", "--fleet", str(path)]) == 2
    out = capsys.readouterr()
    assert "accounts.retail-prod.role_arn" in out.err and "Traceback" not in out.err and out.out == ""


def test_a_cluster_is_declared_once_per_account_and_region() -> None:
    doc = _doc()
    doc["clusters"].append({**doc["clusters"][0]})
    assert any("duplicate cluster 'ml-prod'" in p for p in _problems(doc))
    other = _doc()
    other["clusters"].append({**other["clusters"][2], "region": "eu-west-1"})  # the same name in another region
    assert any("endpoints[4](eval-chat).cluster: 'ml-eval' names 2 clusters" in p for p in _problems(other))
    other["endpoints"][4]["cluster"] = "shared-services/us-west-2/ml-eval"
    inv = parse_inventory(yaml.safe_dump(other))
    assert [c.key for c in inv.clusters][2:] == ["333333333333/us-west-2/ml-eval", "333333333333/eu-west-1/ml-eval"]


def test_a_run_holds_both_clusters_that_share_a_name() -> None:
    """A run's scope may hold both ml-prod clusters: each endpoint's ref names its cluster by key where the fleet
    has that name twice (as written elsewhere), so a run's endpoints stay apart, in its plan's waves too."""
    from kvfleet.airflow.context import narrowed

    inv = narrowed(load_inventory(FLEET))
    assert [c.key for c in inv.clusters] == [RETAIL, PAYMENTS, "333333333333/us-west-2/ml-eval"]
    assert {e.name: e.ref for e in inv.endpoints} == {
        "storefront-chat": f"{RETAIL}:retail/storefront-chat", "catalog-rag": f"{RETAIL}:retail/catalog-rag",
        "disputes-rag": f"{PAYMENTS}:payments/disputes-rag", "chargebacks": f"{PAYMENTS}:payments/chargebacks",
        "eval-chat": "ml-eval:platform/eval-chat"}  # a name one cluster has: as the endpoint wrote it
    # the same namespace/name in both accounts: two endpoints, two refs, one each in a scope and in the plan
    doc = _doc()
    # payments' ml-prod, by its LOB's account
    doc["endpoints"].append({**doc["endpoints"][0], "lob": "payments", "replicas": 1})
    doc["clusters"][1]["gpu_nodes"]["count"] = 5
    both = narrowed(parse_inventory(yaml.safe_dump(doc)))
    twins = [e for e in both.endpoints if e.key == "retail/storefront-chat"]
    assert [e.ref for e in twins] == [f"{RETAIL}:retail/storefront-chat", f"{PAYMENTS}:retail/storefront-chat"]
    assert [e.on(both.clusters[1]) for e in narrowed(both, endpoints=[twins[1].ref]).endpoints] == [True]
    plan = make_plan(both).as_dict()
    refs = {c["key"]: sorted(e["ref"] for w in c["waves"] for e in w["endpoints"]) for c in plan["clusters"]}
    assert refs[PAYMENTS] == [f"{PAYMENTS}:payments/chargebacks", f"{PAYMENTS}:payments/disputes-rag",
                              f"{PAYMENTS}:retail/storefront-chat"]
    assert f"{PAYMENTS}:retail/storefront-chat" not in refs[RETAIL]
    # narrowed to one key, the refs are still the fleet's (what the run's history and Params name)
    assert [e.ref for e in narrowed(both, clusters=[PAYMENTS]).endpoints][-1] == f"{PAYMENTS}:retail/storefront-chat"


# ---- what a hostile review found ---------------------------------------------------------------------------------


def test_patch_mode_plans_update_strategies_per_cluster_key() -> None:
    """The update strategy is read from the endpoint's own cluster, never by re-resolving its bare name."""
    doc = _doc()
    for c in doc["clusters"]:
        c["l2_injection"] = "patch"
    plan = make_plan(parse_inventory(yaml.safe_dump(doc)))
    strategies = {c.key: [s.strategy for w in c.waves for s in w.strategies] for c in plan.clusters}
    assert strategies[PAYMENTS] and strategies[RETAIL]


@pytest.mark.parametrize("name", ["222222222222", "default"])
def test_an_account_name_cannot_read_as_a_key_segment(name: str) -> None:
    doc = _doc()
    doc["accounts"][name] = doc["accounts"].pop("retail-prod")
    doc["clusters"][0]["account"] = doc["lobs"][0]["account"] = name
    problems = _problems(doc)
    assert any(f"accounts.{name}.name: '{name}' is what a cluster key says for" in p for p in problems), problems


def test_an_unresolved_endpoint_counts_on_no_cluster() -> None:
    """An ambiguous reference is one error, not also a GPU overcommit of a cluster it was not resolved to."""
    doc = _doc()
    doc["clusters"].append({**doc["clusters"][0], "region": "eu-west-1"})
    problems = _problems(doc)
    assert any("storefront-chat).cluster: 'ml-prod' names 2 clusters" in p for p in problems), problems
    assert not any("overcommit" in p for p in problems), problems


def test_a_failed_cluster_or_account_leaves_its_endpoints_unresolved() -> None:
    doc = _doc()
    doc["clusters"][1]["gpu_nodes"]["count"] = "x"  # the payments ml-prod fails its own field
    problems = _problems(doc)
    assert len(problems) == 1 and "clusters[1](ml-prod).gpu_nodes.count" in problems[0], problems
    nulls = _doc()
    nulls["accounts"] = {"retail-prod": None, "payments-prod": None, "shared-services": None}
    problems = _problems(nulls)
    assert not any("overcommit" in p or "not a declared cluster" in p for p in problems), problems
    assert any("accounts.retail-prod.id" in p for p in problems), problems


def test_bootstrap_takes_a_cluster_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bootstrap", "--fleet", str(FLEET), "--cluster", PAYMENTS, "--print"]) == 0
    bundle = capsys.readouterr().out
    assert "namespace: payments" in bundle and "namespace: retail" not in bundle
    assert cli.main(["bootstrap", "--fleet", str(FLEET), "--cluster", "ml-prod", "--print"]) == 2
    assert f"'ml-prod' names 2 clusters ({RETAIL}, {PAYMENTS})" in capsys.readouterr().err


def test_notifications_find_the_lobs_of_a_cluster_key(example_fleet: Path) -> None:
    from kvfleet.airflow.notify import lobs_of

    inv = load_inventory(FLEET)
    assert lobs_of(inv, clusters=[PAYMENTS]) == {"payments"}
    assert lobs_of(inv, clusters=["ml-prod"]) == {"retail", "payments"}  # a name: every cluster that has it
    single = load_inventory(example_fleet)
    assert lobs_of(single, clusters=["default/us-west-2/ml-stage-usw2"]) == lobs_of(single, clusters=["ml-stage-usw2"])
