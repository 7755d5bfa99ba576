"""Hostile requests to the sandbox admin API answer 4xx with a message and change nothing.

A real sandbox (workloads and vLLM controllers) on 127.0.0.1. Per case the oracle compares a snapshot of every
setting a fault could change (API error rate and latency on kube and AWS, the L2 read penalty, node taints and
annotations, the kube API request counters) before and after.
"""

from __future__ import annotations

import json
import socket
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fuzzgen
import pytest

from kvfleet.fleet.inventory import parse_inventory
from kvfleet_sandbox.runtime import Sandbox, start_sandbox

SEEDS = json.loads((Path(__file__).resolve().parents[2] / "tests" / "data" / "fuzz_seeds.json").read_text())
CLUSTER = "c1"


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    inv = parse_inventory("""
lobs: [{name: retail}]
clusters: [{name: c1, region: us-east-1, gpu_nodes: {count: 2, instance_type: ml.g5.4xlarge}}]
""")
    sandbox = start_sandbox(inv, tempfile.mkdtemp(prefix="kvfleet-fuzz-admin-"), controllers=("workloads", "vllm"))
    try:
        yield sandbox
    finally:
        sandbox.stop()


def _snapshot(sb: Sandbox) -> Any:
    twin = sb.twins[CLUSTER]
    nodes = [(n["metadata"].get("annotations"), (n.get("spec") or {}).get("taints"))
             for n in (twin.store.get("", "nodes", name) or {"metadata": {}} for name in twin.gpu_nodes)]
    server = sb.servers[CLUSTER]
    return (server.error_rate, server.latency_s, sb.aws.error_rate, sb.aws.latency_s,
            twin.services["vllm"].l2_read_penalty_ms, nodes, dict(twin.store.request_counts()))


def _post(sb: Sandbox, body: bytes) -> tuple[int, Any]:
    req = urllib.request.Request(sb.admin.url + "/fault", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def _raw(sb: Sandbox, head: str, body: bytes = b"", read_timeout: float = 15) -> str:
    with socket.create_connection(("127.0.0.1", sb.admin.port), timeout=read_timeout) as s:
        s.sendall(head.encode() + body)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _run_admin(sb: Sandbox, count: int) -> None:
    base = SEEDS["admin"]["base_seed"]
    failures = []
    for seed in range(base, base + count):
        case_id, body = fuzzgen.admin_case(seed, CLUSTER)
        before = _snapshot(sb)
        status, answer = _post(sb, json.dumps(body).encode())
        after = _snapshot(sb)
        if not 400 <= status < 500 or not isinstance(answer, dict) or not answer.get("error"):
            failures.append(f"{case_id} {body!r}: {status} {answer!r}")
        elif before != after:
            failures.append(f"{case_id} {body!r}: refused but changed the sandbox")
        elif len(answer["error"]) > 1000:
            failures.append(f"{case_id}: an unbounded message")
    assert not failures, "\n".join(failures)


def test_hostile_fault_bodies_answer_4xx_and_change_nothing(sb: Sandbox) -> None:
    _run_admin(sb, SEEDS["admin"]["count"])


@pytest.mark.fuzz_long
def test_hostile_fault_bodies_long(sb: Sandbox) -> None:
    _run_admin(sb, SEEDS["admin"]["long_count"])


@pytest.mark.parametrize("body, status, words", [
    ({"kind": "l2_read_penalty", "ms": [1]}, 400, "'ms' must be a number"),
    ({"kind": "lose_node", "node": "ghost"}, 404, "no node 'ghost'"),
    ({"kind": "api_error_rate", "rate": True}, 400, "'rate' must be a number"),
])
def test_the_issue_cases(sb: Sandbox, body: dict[str, Any], status: int, words: str) -> None:
    before = _snapshot(sb)
    code, answer = _post(sb, json.dumps({**body, "cluster": CLUSTER}).encode())
    assert (code, words in answer["error"]) == (status, True), answer
    assert _snapshot(sb) == before


def test_a_valid_fault_still_works(sb: Sandbox) -> None:
    code, _ = _post(sb, json.dumps({"kind": "l2_read_penalty", "ms": 5, "cluster": CLUSTER}).encode())
    assert code == 200 and sb.twins[CLUSTER].services["vllm"].l2_read_penalty_ms == 5.0
    _post(sb, json.dumps({"kind": "l2_read_penalty", "ms": 0, "cluster": CLUSTER}).encode())


@pytest.mark.parametrize("length, status", [("1000000000000", "413"), ("abc", "400"), ("-5", "400"),
                                            ("70000", "413"), ("1e3", "400")])
def test_bad_content_length_is_answered_without_reading(sb: Sandbox, length: str, status: str) -> None:
    answer = _raw(sb, f"POST /fault HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n")
    assert answer.startswith(f"HTTP/1.0 {status}") or answer.startswith(f"HTTP/1.1 {status}"), answer[:200]


def test_deep_json_and_nan_are_400(sb: Sandbox) -> None:
    assert _post(sb, b"[" * 5000 + b"]" * 5000)[0] == 400
    assert _post(sb, b'{"kind": "api_error_rate", "rate": NaN}')[0] == 400
    assert _post(sb, b"\xff\xfe")[0] == 400


def test_a_stalled_body_times_out_and_the_server_keeps_answering(sb: Sandbox) -> None:
    answer = _raw(sb, "POST /fault HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", b"{", read_timeout=20)
    assert " 408 " in answer.splitlines()[0]
    with urllib.request.urlopen(sb.admin.url + "/health", timeout=5) as resp:
        assert json.load(resp) == {"ok": True}
