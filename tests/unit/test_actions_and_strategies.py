"""The pure parts of the typed actions and the update strategies: the patch wave's action
sequence, the strategy judge, the GPU room, the inventory field and what the plan says."""

from __future__ import annotations

import json

import pytest

from kvfleet.errors import InventoryError
from kvfleet.fleet import actions as A
from kvfleet.fleet.hardware import spare_gpus
from kvfleet.fleet.inventory import parse_inventory
from kvfleet.fleet.plan import ROLLING, SURGE, choose_strategy, choose_wave_strategies, make_plan, render_plan_text

PATCH = A.canonical([{"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "curvine"}}])
ORIGINAL = A.canonical({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})


def _item(name: str, strategy: str, replicas: int = 2) -> A.WaveItem:
    temporary = {"rolling": ROLLING, "surge": SURGE}.get(strategy)
    return A.WaveItem(f"c:ns/{name}", "ns", name, replicas, strategy, PATCH, ORIGINAL,
                      A.canonical(temporary) if temporary else None)


def test_a_mixed_wave_pauses_once_never_zeroes_rolled_endpoints_and_restores_last() -> None:
    seq = A.patch_wave_actions("ctrl", "run/1", [_item("a", "rolling"), _item("b", "scale-to-zero", 3),
                                                 _item("c", "surge", 1)])
    kinds = [type(a).__name__ for a in seq]
    assert kinds[0] == "PauseOperator" and kinds[-1] == "RestoreOperator"
    assert kinds.count("PauseOperator") == kinds.count("RestoreOperator") == 1
    scales = [(a.name, a.replicas) for a in seq if isinstance(a, A.Scale)]
    assert scales == [("b", 0), ("b", 3)]  # only the scale-to-zero endpoint, and back to its replicas
    strategies = [(a.name, a.restore, json.loads(a.strategy)) for a in seq if isinstance(a, A.SetRolloutStrategy)]
    assert strategies == [("a", False, ROLLING), ("c", False, SURGE), ("a", True, json.loads(ORIGINAL)),
                          ("c", True, json.loads(ORIGINAL))]
    ready = next(i for i, a in enumerate(seq) if isinstance(a, A.WaitPods) and a.new_env)
    first_restore = next(i for i, a in enumerate(seq) if isinstance(a, A.SetRolloutStrategy) and a.restore)
    assert ready < first_restore < len(seq) - 1  # ready, then the strategies back, then the operator
    patches = [i for i, a in enumerate(seq) if isinstance(a, A.PatchDeployment)]
    assert all(isinstance(seq[i + 1], A.VerifyRendered) for i in patches)  # each patch read back at once
    assert [a.strategy for a in seq if isinstance(a, A.VerifyRendered) and a.strategy] == [ORIGINAL, ORIGINAL]
    wait_ready = seq[ready]
    assert isinstance(wait_ready, A.WaitPods)
    assert wait_ready.want == (("ns/a", 2), ("ns/b", 3), ("ns/c", 1))
    assert isinstance(seq[-2], A.WaitRolledOut) and seq[-2].want == wait_ready.want  # observed before restore
    assert A.patch_wave_actions("ctrl", "run/1", []) == []
    temporary = next(a for a in seq if isinstance(a, A.SetRolloutStrategy))
    assert temporary.ops()[1] == {"op": "add", "path": "/metadata/annotations/kvfleet.io~1original-strategy",
                                  "value": ORIGINAL}  # the original recorded on the object, for a later run
    back = next(a for a in seq if isinstance(a, A.SetRolloutStrategy) and a.restore)
    assert back.ops()[1] == {"op": "remove", "path": "/metadata/annotations/kvfleet.io~1original-strategy"}


def test_a_strategy_left_by_a_killed_run_is_put_back_inside_its_own_pause() -> None:
    left = A.SetRolloutStrategy("c:ns/a", "ns", "a", ORIGINAL, restore=True)
    seq = A.strategy_repair_actions("ctrl", "run/2", [(left, 2)])
    assert [type(a).__name__ for a in seq] == ["PauseOperator", "SetRolloutStrategy", "WaitRolledOut",
                                               "RestoreOperator"]
    assert A.strategy_repair_actions("ctrl", "run/2", []) == []


def test_actions_render_marked_equivalents_and_compare_on_the_call_not_the_diff() -> None:
    a = A.UpdateCluster("hp", "Enable", 30, "Automatic", diff="- x")
    assert a.equivalent() == ("aws sagemaker update-cluster --cluster-name hp --tiered-storage-config "
                              "Mode=Enable,InstanceMemoryAllocationPercentage=30 --node-recovery Automatic")
    assert A.UpdateCluster("hp", None, None, "None").equivalent() == \
        "aws sagemaker update-cluster --cluster-name hp --node-recovery None"
    assert a == A.UpdateCluster("hp", "Enable", 30, "Automatic", diff="another rendering of the diff")
    assert A.render(a) == f"{A.EQUIVALENT_MARK} {a.equivalent()}"
    patch = A.PatchDeployment("c:ns/a", "ns", "a", PATCH)
    assert patch.equivalent() == f"kubectl patch deployment a -n ns --type=json -p '{PATCH}'"
    assert A.Scale("c:ns/a", "ns", "a", 0).equivalent() == "kubectl scale deployment a -n ns --replicas=0"
    create = A.CreateAddon("eks", "cert-manager", "v1.0.0-eksbuild.1", A.canonical({"a": 1}), "OVERWRITE")
    assert create.equivalent() == ("aws eks create-addon --cluster-name eks --addon-name cert-manager "
                                   "--addon-version v1.0.0-eksbuild.1 --configuration-values '{\"a\":1}' "
                                   "--resolve-conflicts OVERWRITE")
    assert create.config() == {"a": 1}


@pytest.mark.parametrize(("asked", "replicas", "spare", "strategy", "refused"), [
    ("auto", 2, 0, "rolling", False),
    ("auto", 3, 5, "rolling", False),
    ("auto", 1, 1, "surge", False),
    ("auto", 1, 0, "scale-to-zero", False),
    ("auto", 0, 0, "scale-to-zero", False),
    ("rolling", 2, 0, "rolling", False),
    ("rolling", 1, 4, "rolling", True),  # would leave 0 serving
    ("surge", 1, 1, "surge", False),
    ("surge", 2, 0, "surge", True),  # the maxSurge deadlock
    ("scale-to-zero", 4, 9, "scale-to-zero", False),
])
def test_choose_strategy(asked: str, replicas: int, spare: int, strategy: str, refused: bool) -> None:
    choice = choose_strategy(asked, replicas, spare)
    assert (choice.strategy, choice.refused is not None) == (strategy, refused)
    assert choice.reason


def test_a_wave_shares_its_spare_gpus_between_surging_endpoints() -> None:
    chosen = choose_wave_strategies([("a", "auto", 1, "cluster"), ("b", "auto", 1, "cluster"),
                                     ("c", "surge", 1, "endpoint")], spare_gpus=1)
    assert [chosen[k].strategy for k in "abc"] == ["surge", "scale-to-zero", "surge"]
    assert chosen["c"].refused is not None and "spare GPU" in chosen["c"].refused


def _node(name: str, gpus: int, ready: bool = True, unschedulable: bool = False) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _pod(node: str | None, gpus: int, phase: str = "Running") -> dict[str, object]:
    return {"spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": phase}}


def test_spare_gpus_counts_allocatable_minus_requested_on_schedulable_nodes() -> None:
    nodes = [_node("n1", 4), _node("n2", 1), _node("down", 8, ready=False), _node("cordoned", 8, unschedulable=True)]
    pods = [_pod("n1", 1), _pod("n1", 1), _pod("n2", 1), _pod("n2", 1, "Succeeded"), _pod("down", 1)]
    assert spare_gpus(nodes, pods) == 2
    assert spare_gpus(nodes, [*pods, _pod(None, 1, "Pending")]) == 1  # a Pending pod takes one first
    assert spare_gpus([_node("n", 1)], [_pod("n", 1), _pod("n", 1)]) == 0  # never negative
    typed = {**_node("g6e", 2), "metadata": {"name": "g6e",
                                              "labels": {"node.kubernetes.io/instance-type": "ml.g6e.4xlarge"}}}
    assert spare_gpus([typed, _node("other", 4)], [], "ml.g6e.4xlarge") == 2  # node affinity: that type only


FLEET = """
lobs: [{name: retail}]
clusters:
  - name: c1
    region: us-east-1
    gpu_nodes: {count: 3, instance_type: ml.g6e.4xlarge}
    %(cluster)s
endpoints:
  - {name: a, namespace: retail, lob: retail, cluster: c1, model: m, instance_type: ml.g6e.4xlarge, replicas: 2%(a)s}
  - {name: b, namespace: retail, lob: retail, cluster: c1, model: m, instance_type: ml.g6e.4xlarge, replicas: 1%(b)s}
"""


def _fleet(cluster: str = "", a: str = "", b: str = "") -> str:
    return FLEET % {"cluster": cluster, "a": a, "b": b}


def test_update_strategy_is_validated_with_field_value_allowed_values_and_fix() -> None:
    with pytest.raises(InventoryError) as err:
        parse_inventory(_fleet(cluster="update_strategy: blue-green", a=", update_strategy: 3"))
    text = str(err.value)
    assert "clusters.c1.update_strategy: 'blue-green' is not an update strategy" in text
    assert "endpoints[0](a).update_strategy: 3 is not an update strategy" in text
    for allowed in ("auto", "rolling", "surge", "scale-to-zero"):
        assert allowed in text
    with pytest.raises(InventoryError, match=r"endpoints\[1\]\(b\)\.update_strategy: rolling \(from clusters\.c1"
                                             r"\.update_strategy\) with replicas 1.*scale-to-zero"):
        parse_inventory(_fleet(cluster="update_strategy: rolling"))


def test_an_endpoint_overrides_its_cluster_and_the_plan_says_which_strategy_and_why() -> None:
    inv = parse_inventory(_fleet(cluster="update_strategy: scale-to-zero", a=", update_strategy: auto"))
    a, b = inv.endpoints
    assert inv.update_strategy(a) == ("auto", "endpoint") and inv.update_strategy(b) == ("scale-to-zero", "cluster")
    plan = make_plan(inv, canary=False)
    (wave,) = plan.clusters[0].waves
    got = {e["name"]: e["update_strategy"] for e in wave.as_dict()["endpoints"]}
    assert got["a"]["strategy"] == "rolling" and "2 replicas" in got["a"]["why"]
    assert got["b"] == {"strategy": "scale-to-zero", "why": "asked (cluster update_strategy)"}
    text = render_plan_text(plan)
    assert "retail/a: rolling — auto: 2 replicas" in text and "retail/b: scale-to-zero — asked" in text
    # auto with 1 replica: 3 GPUs declared, 3 asked -> no room, scale-to-zero; with a 4th node, surge.
    inv = parse_inventory(_fleet())
    assert make_plan(inv, canary=False).clusters[0].waves[0].strategies[1].strategy == "scale-to-zero"
    inv = parse_inventory(_fleet().replace("count: 3", "count: 4"))
    assert make_plan(inv, canary=False).clusters[0].waves[0].strategies[1].strategy == "surge"


def test_kyverno_clusters_get_no_update_strategy_in_the_plan() -> None:
    inv = parse_inventory(_fleet(cluster="l2_injection: kyverno"))
    plan = make_plan(inv, canary=False)
    assert all(not w.strategies for w in plan.clusters[0].waves)
    assert all("update_strategy" not in e for e in plan.clusters[0].waves[0].as_dict()["endpoints"])
    assert "kyverno mode" in render_plan_text(plan)
