"""The inventory's messages keep their substance across rewrites of the validator.

``golden/inventory_messages.json`` holds what the validator said about 85 bad inventories (golden_cases.py wrote it).
For each case the validator of today must report the same problems, all at once: the same multiset of
``file: path`` prefixes, and each message must still carry every informative token of the recorded one (the quoted
value, numbers, identifiers such as ``ml.g5.4xlarge`` or ``0–4294967295``, the allowed values, the example of the
fix). The wording around them may change; the information may not be lost.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from golden_cases import GOLDEN, messages

from kvfleet.fleet import constants as C
from kvfleet.fleet import models
from kvfleet.fleet.inventory import vocabulary as inventory

CASES: list[dict[str, Any]] = json.loads(GOLDEN.read_text(encoding="utf-8"))
# Allowed values that are plain lowercase words (a token rule below would skip them).
ENUMS = {*C.ROUTING_STRATEGIES, *inventory.L2_INJECTION_CHOICES, *inventory.UPDATE_STRATEGIES, *inventory.WORKLOADS,
         *C.TIERED_MODES, *C.NODE_RECOVERY_VALUES, *models.DTYPES, "naive", "report", "auto", "true", "false"}
_TOKEN = re.compile(r"'(?:[^'\\]|\\.)*'|[^\s,;()]+")


def _prefix(message: str) -> str:
    """``file: path`` of a problem: up to the second ': ' (a path never holds ': ')."""
    head, _, rest = message.partition(": ")
    path, _, _ = rest.partition(": ")
    return f"{head}: {path}"


def tokens(message: str) -> set[str]:
    """The informative tokens of a message: quoted values, numbers, identifiers, allowed values."""
    out = set()
    for tok in _TOKEN.findall(message):
        tok = tok.rstrip(".:")
        if tok.startswith("'") or tok in ENUMS or re.search(r"[0-9A-Z._/@:'\-–\\]", tok):
            out.add(tok)
    return out


def lost(old: list[str], new: list[str]) -> list[str]:
    """What of ``old`` is missing from ``new`` (empty when every problem and its substance is kept)."""
    out = []
    if Counter(map(_prefix, old)) != Counter(map(_prefix, new)):
        out.append(f"problems differ: {sorted(map(_prefix, old))} != {sorted(map(_prefix, new))}")
        return out
    for msg in old:
        same = [m for m in new if _prefix(m) == _prefix(msg)]
        missing = [min(tokens(msg) - tokens(m), key=len, default="") for m in same]
        if all(missing):
            best = min((tokens(msg) - tokens(m) for m in same), key=len)
            out.append(f"{_prefix(msg)}: lost {sorted(best)}")
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_messages_keep_their_substance(case: dict[str, Any]) -> None:
    now = messages(case["text"])
    assert not lost(case["problems"], now["problems"]), (lost(case["problems"], now["problems"]), now["problems"])
    assert not lost(case["warnings"], now["warnings"]), (lost(case["warnings"], now["warnings"]), now["warnings"])


def test_the_comparison_can_fail() -> None:
    old = ["fleet.yaml: clusters.c1.gpu_nodes.count: 0 is below 1; set it to 1 or more",
           "fleet.yaml: endpoints[0](chat).routing: 'fast' is not one of kvaware, prefixaware; pick one"]
    assert lost(old, old) == []
    assert lost(old, old[:1])  # a problem dropped
    assert lost(old, [old[0], "fleet.yaml: endpoints[0](chat).routing: 'fast' is not one of kvaware"])  # allowed
    assert lost(old, [old[0].replace("0 is", "the value is"), old[1]])  # the value
    assert lost(old, [old[0], old[1].replace("endpoints[0](chat)", "endpoints.0")])  # the path
    assert lost(old, [old[0].replace("fleet.yaml", "x.yaml"), old[1]])  # the file


def test_the_golden_file_covers_enough() -> None:
    assert len(CASES) >= 40 and sum(len(c["problems"]) for c in CASES) >= 60
    assert sum(1 for c in CASES if len(c["problems"]) > 1) >= 5  # documents with several problems at once
    assert Path(GOLDEN).is_file()
