"""Bad inventories whose messages are kept as golden files (tests/fuzz/golden/inventory_messages.json).

The golden file was written from the hand-written validator that preceded the pydantic models, so a rewrite of the
validation is checked against what users were told before: ``test_golden_messages.py`` asserts every recorded
problem is still reported with its file, YAML path, value, allowed values and fix. Regenerate only on purpose:
``python tests/fuzz/golden_cases.py --write`` (then review the diff: a lost token is lost information).

Cases: one bad value per field of ``fuzzgen.BAD_VALUES``, the refused fuzz seeds 17000–17059, and the multi-problem
documents of the inventory unit tests.
"""

from __future__ import annotations

import copy
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzgen

GOLDEN = Path(__file__).with_name("golden") / "inventory_messages.json"

_UNIT_BASE: dict[str, Any] = {
    "lobs": [{"name": "retail"}],
    "clusters": [{"name": "c1", "region": "us-east-1", "gpu_nodes": {"count": 2, "instance_type": "ml.g5.4xlarge"}}],
    "endpoints": [{"name": "chat", "namespace": "retail", "lob": "retail", "cluster": "c1", "model": "qwen2-7b",
                   "instance_type": "ml.g5.4xlarge"}],
}


def _dump(doc: Any) -> str:
    return str(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False, width=10_000))


def _bad_values() -> list[tuple[str, str]]:
    out = []
    for path, values in fuzzgen.BAD_VALUES:
        value = values[len(path) % len(values)]  # one deterministic pick per field
        doc = copy.deepcopy(fuzzgen.BASE)
        fuzzgen._set(doc, path, value)
        out.append((f"bad:{'.'.join(map(str, path))}", _dump(doc)))
    return out


def _seeds() -> list[tuple[str, str]]:
    out = []
    for seed in range(17000, 17060):
        case_id, text, expect, _ = fuzzgen.inventory_case(seed)
        if expect == "refuse" and not case_id.startswith(("structure:", "yaml:")):
            out.append((case_id, text))
    return out


def _unit(mutate: Any) -> str:
    doc = copy.deepcopy(_UNIT_BASE)
    mutate(doc)
    return _dump(doc)


def _many(d: dict[str, Any]) -> None:
    d["clusters"][0]["tiered_storage"] = {"memory_percent": 5}
    d["endpoints"][0].update(routing="fast", instance_type="p4d", cluster="zzz")


def _overcommit(d: dict[str, Any]) -> None:
    d["clusters"][0]["gpu_nodes"]["count"] = 4
    d["endpoints"] += [{**d["endpoints"][0], "name": f"chat{i}"} for i in (2, 3)]


def _mapping_form(d: dict[str, Any]) -> None:
    d["clusters"] = {"c1": {"region": "us-east", "gpu_nodes": {"count": 0, "instance_type": "ml.g5.4xlarge"},
                            "curvine": {"master": {"replicas": 2}, "worker": {"size": "1G"}}}}
    d["endpoints"] = {"chat": {**d["endpoints"][0], "replicas": 1, "update_strategy": "sideways"}}
    del d["endpoints"]["chat"]["name"]


def _units() -> list[tuple[str, str]]:
    return [
        ("unit:cluster-and-lob", _unit(lambda d: d["endpoints"][0].update(cluster="nope", lob="ghost"))),
        ("unit:duplicate-endpoint", _unit(lambda d: d["endpoints"].append(dict(d["endpoints"][0])))),
        ("unit:many", _unit(_many)),
        ("unit:unknown-field", _unit(lambda d: d["clusters"][0].update(memory_pct=20))),
        ("unit:overcommit", _unit(_overcommit)),
        ("unit:rolling-one", _unit(lambda d: d["endpoints"][0].update(replicas=1, update_strategy="rolling"))),
        ("unit:notify", _unit(lambda d: d["lobs"][0].update(
            notify={"sns_topic_arn": "arn:aws:sns:us-east-1:1234:t", "webhook_url": "ftp://x/secret"}))),
        ("unit:prices", _unit(lambda d: d.update(prices={"g5": 1.0, "ml.g5.4xlarge": -1, "ml.g5.2xlarge": "x"}))),
        ("unit:mapping-form", _unit(_mapping_form)),
        ("unit:no-cluster", "lobs: [{name: retail}]\n"),
        ("unit:top-unknown", _unit(lambda d: d.update(setting={"wave_size": 3}))),
        ("unit:addon", _unit(lambda d: d["clusters"][0].update(addons={
            "amazon-sagemaker-hyperpod-inference": {"version": "1.0", "configuration": [1]}, "nope": {}}))),
    ]


def cases() -> list[tuple[str, str]]:
    return _bad_values() + _seeds() + _units()


def messages(text: str) -> dict[str, list[str]]:
    """What the validator says about ``text``: its problems (empty when it accepts) and warnings."""
    from kvfleet.errors import InventoryError
    from kvfleet.fleet.inventory import parse_inventory

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            parse_inventory(text, source="fleet.yaml")
            problems: list[str] = []
        except InventoryError as exc:
            problems = list(exc.problems)
    return {"problems": problems, "warnings": [str(w.message) for w in caught]}


def main() -> int:
    if "--write" not in sys.argv:
        print("usage: python tests/fuzz/golden_cases.py --write", file=sys.stderr)
        return 2
    out = [{"id": case_id, "text": text, **messages(text)} for case_id, text in cases()]
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(out)} cases, {sum(len(c['problems']) for c in out)} problems -> {GOLDEN}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
