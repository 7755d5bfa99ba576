"""The hourly sweep's batch plan (``fleet.verify_batches``): endpoints whose pods share no node in one
batch, greedy in inventory order, unknown nodes alone; and the ``max_parallel`` Param's range.

hypothesis is not in the venv (tests/unit/test_overlay_properties.py), so the property test draws its cases from a
seeded generator: every case is reproducible from its seed, printed on failure."""

from __future__ import annotations

import random

import pytest

from kvfleet.fleet.verify_batches import describe, nodes_by_endpoint, plan_batches

CASES = 500


def _pod(ns: str, app: str, node: str | None, *, phase: str | None = "Running", deleting: bool = False) -> dict:  # type: ignore[type-arg]
    meta: dict = {"namespace": ns, "name": f"{app}-{node}", "labels": {"app": app}}  # type: ignore[type-arg]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


def _check(order: list[str], nodes: dict[str, frozenset[str] | None], batches: list[list[str]]) -> None:
    flat = [k for b in batches for k in b]
    assert sorted(flat) == sorted(order) and len(flat) == len(set(flat))  # every endpoint exactly once
    for batch in batches:
        assert batch, "no empty batch"
        assert batch == sorted(batch, key=order.index)  # inventory order inside a batch
        for i, a in enumerate(batch):
            if nodes.get(a) is None:
                assert batch == [a], f"{a} has unknown nodes but shares batch {batch}"
            for b in batch[i + 1:]:
                assert not (nodes[a] or frozenset()) & (nodes[b] or frozenset()), f"{a} and {b} share a node"
    firsts = [order.index(b[0]) for b in batches]
    assert firsts == sorted(firsts)


def _greedy_reference(order: list[str], nodes: dict[str, frozenset[str] | None]) -> list[list[str]]:
    """The rule restated independently: put each endpoint in the lowest-numbered batch it conflicts with nobody in."""
    assign: dict[str, int] = {}
    count = 0
    for k in order:
        if nodes.get(k) is None:
            assign[k], count = count, count + 1
            continue
        for i in range(count):
            members = [m for m, j in assign.items() if j == i]
            if all(nodes.get(m) is not None and not (nodes[m] or frozenset()) & (nodes[k] or frozenset())
                   for m in members):
                assign[k] = i
                break
        else:
            assign[k], count = count, count + 1
    return [[k for k in order if assign[k] == i] for i in range(count)]


def test_disjoint_endpoints_share_a_batch_and_sharing_ones_do_not() -> None:
    order = ["a", "b", "c", "d", "e"]
    nodes: dict[str, frozenset[str] | None] = {
        "a": frozenset({"n1", "n2"}), "b": frozenset({"n3", "n4"}), "c": frozenset({"n2", "n5"}),
        "d": None, "e": frozenset({"n6", "n1"})}
    batches = plan_batches(order, nodes)
    assert batches == [["a", "b"], ["c", "e"], ["d"]]
    _check(order, nodes, batches)
    assert describe(batches) == "5 endpoint(s) in 3 batch(es) of node-disjoint endpoints, sizes 2, 2, 1"


def test_the_example_fleet_shape_is_one_batch_and_half_the_nodes_bound_a_batch() -> None:
    # 7 endpoints x 2 pods on 16 one-GPU nodes (tests/fleets/twin.yaml's ml-prod-use1): one batch of 7.
    order = [f"e{i}" for i in range(7)]
    nodes: dict[str, frozenset[str] | None] = {k: frozenset({f"n{2 * i}", f"n{2 * i + 1}"})
                                               for i, k in enumerate(order)}
    assert plan_batches(order, nodes) == [order]
    # 10 endpoints x 2 pods over 8 nodes: no batch can hold more than 8 / 2 endpoints
    order = [f"e{i}" for i in range(10)]
    nodes = {k: frozenset({f"n{(2 * i) % 8}", f"n{(2 * i + 1) % 8}"}) for i, k in enumerate(order)}
    batches = plan_batches(order, nodes)
    assert [len(b) for b in batches] == [4, 4, 2]
    _check(order, nodes, batches)


def test_unknown_nodes_are_alone_and_nothing_joins_them() -> None:
    order = ["x", "a", "b"]
    nodes: dict[str, frozenset[str] | None] = {"x": None, "a": frozenset({"n1"}), "b": frozenset({"n2"})}
    assert plan_batches(order, nodes) == [["x"], ["a", "b"]]
    assert plan_batches(["a", "x"], {"a": frozenset({"n1"})}) == [["a"], ["x"]]  # missing = unknown
    assert plan_batches([], {}) == []


def test_an_endpoint_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="once"):
        plan_batches(["a", "a"], {"a": frozenset({"n1"})})


def test_property_node_disjoint_every_endpoint_once_deterministic() -> None:
    for seed in range(CASES):
        rng = random.Random(seed)
        n_nodes = rng.randint(1, 12)
        order = [f"ns/e{i}" for i in range(rng.randint(0, 25))]
        rng.shuffle(order)
        nodes: dict[str, frozenset[str] | None] = {}
        for k in order:
            roll = rng.random()
            if roll < 0.1:
                nodes[k] = None
            elif roll < 0.15:
                continue  # not in the mapping: unknown
            else:
                nodes[k] = frozenset(f"n{rng.randrange(n_nodes)}" for _ in range(rng.randint(0, 3)))
        batches = plan_batches(order, nodes)
        _check(order, nodes, batches)
        # the mapping's order is irrelevant; the rule, restated independently, gives the same plan
        assert batches == plan_batches(list(order), dict(reversed(list(nodes.items())))), f"seed {seed}"
        assert batches == _greedy_reference(order, nodes), f"seed {seed}"


def test_nodes_come_from_live_pods_of_the_endpoint_s_own_namespace_and_label() -> None:
    pods = [_pod("retail", "chat", "n1"), _pod("retail", "chat", "n2"),
            _pod("retail", "chat", "n3", deleting=True),  # terminating: not a replica
            _pod("retail", "chat", "n4", phase="Succeeded"),
            _pod("payments", "chat", "n5"),  # same name, another namespace: another endpoint
            _pod("retail", "rag", None, phase="Pending"),  # not bound to a node yet
            {"metadata": {"namespace": "retail", "name": "nolabel"}, "spec": {"nodeName": "n9"}, "status": {}}]
    got = nodes_by_endpoint(pods, [("retail/chat", "retail", "chat"), ("payments/chat", "payments", "chat"),
                                   ("retail/rag", "retail", "rag"), ("retail/none", "retail", "none")])
    assert got == {"retail/chat": frozenset({"n1", "n2"}), "payments/chat": frozenset({"n5"}),
                   "retail/rag": None, "retail/none": None}


def test_max_parallel_param_and_its_check_agree() -> None:
    from kvfleet.airflow import verification
    from kvfleet.airflow.params import verification_params
    from kvfleet.errors import PermanentError

    param = verification_params()["max_parallel"]
    assert param.value == verification.DEFAULT_MAX_PARALLEL
    assert (param.schema["minimum"], param.schema["maximum"]) == (1, verification.MAX_PARALLEL_LIMIT)
    assert verification.check_max_parallel(1) == 1
    assert param.resolve(8.0) == 8.0 and verification.check_max_parallel(8.0) == 8  # JSON's 8.0 passes the Param
    for bad in (0, verification.MAX_PARALLEL_LIMIT + 1, "8", 2.5, True, None):
        with pytest.raises(PermanentError, match=r"max_parallel: .* from 1 to 32"):
            verification.check_max_parallel(bad)
