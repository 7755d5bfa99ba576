"""Hostile `accounts` and account references through the real `kvfleet validate` (each case in its own fork, with
the caps and the oracle of test_fuzz_inventory): tests/fleets/multi-account.yaml with one bad value per account
field (refused, naming the field), and seeded swaps of any value into the accounts, the clusters' and LOBs'
`account` and the endpoints' `cluster` (refused or accepted; an acceptance must be valid by
:func:`accounts_problems`, a check written apart from kvfleet's validator).
"""

from __future__ import annotations

import copy
import random
import re
from pathlib import Path
from typing import Any

import yaml
from fuzzgen import SWAPS
from test_fuzz_inventory import _check, _run

FLEET = Path(__file__).resolve().parents[1] / "fleets" / "multi-account.yaml"
SEEDS = range(23000, 23080)

BAD: list[tuple[tuple[Any, ...], list[Any]]] = [
    (("accounts", "retail-prod", "id"), [111111111111, "11111111111", "1111111111111", "١١١١١١١١١١١١",
                                         " 111111111111", "", None, True, "abcdefghijkl", 1.5]),
    (("accounts", "retail-prod", "role_arn"), ["arn:aws:iam::111111111111:user/x", "arn:aws:iam::999999999999:role/x",
                                               "arn:aws:iam:::role/x", "role/x", "arn:aws:iam::111111111111:role/",
                                               "arn:aws:iam::111111111111:role/" + "r" * 65, 5, "arn:aws:iam::"
                                               "111111111111:role/a b"]),
    (("accounts", "retail-prod", "external_id"), ["x", "a b", "e" * 1225, {}]),
    (("accounts", "shared-services", "aws_conn_id"), ["a b", "c" * 251, "ü", []]),
    (("accounts", "payments-prod", "session_duration_s"), [899, 43201, "3600", 3600.5, True, None]),
    (("clusters", 2, "account"), ["nope", 5, "Shared-Services", True]),
    (("lobs", 0, "account"), ["nope", False]),
    (("endpoints", 0, "cluster"), ["999999999999/us-east-1/ml-prod", "retail-prod/us-west-2/ml-prod", "a/b",
                                   "ml-prod/", "/us-east-1/ml-prod"]),
]

ACCOUNT_ID = re.compile(r"[0-9]{12}", re.ASCII)
ROLE = re.compile(r"arn:aws(-cn|-us-gov)?:iam::([0-9]{12}):role/([\w+=,.@-]+/)*[\w+=,.@-]{1,64}", re.ASCII)


def _named(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    return {str(v.get("name")): v for v in value or [] if isinstance(v, dict)}


def accounts_problems(doc: Any) -> list[str]:  # noqa: C901 (one rule per line)
    """The account rules, written apart from kvfleet: what makes the accounts part of an inventory invalid."""
    out: list[str] = []
    accounts = _named(doc.get("accounts"))
    ids: list[str] = []
    for name, a in accounts.items():
        if not isinstance(a, dict):
            out.append(f"{name}: not a mapping")
            continue
        aid, role = a.get("id"), a.get("role_arn")
        if not isinstance(aid, str) or not ACCOUNT_ID.fullmatch(aid):
            out.append(f"{name}.id")
        ids.append(str(aid))
        if role is not None and (not isinstance(role, str) or not (m := ROLE.fullmatch(role)) or m.group(2) != aid):
            out.append(f"{name}.role_arn")
        ext = a.get("external_id")
        if ext is not None and (not isinstance(ext, str) or not re.fullmatch(r"[\w+=,.@:/-]{2,1224}", ext, re.ASCII)):
            out.append(f"{name}.external_id")
        conn = a.get("aws_conn_id")
        if conn is not None and (not isinstance(conn, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,250}", conn)):
            out.append(f"{name}.aws_conn_id")
        dur = a.get("session_duration_s", 3600)
        if isinstance(dur, bool) or not isinstance(dur, int) or not 900 <= dur <= 43200:
            out.append(f"{name}.session_duration_s")
    if len(set(ids)) != len(ids):
        out.append("duplicate account id")
    for kind in ("clusters", "lobs"):
        for item in doc.get(kind) or []:
            ref = item.get("account") if isinstance(item, dict) else None
            if ref is not None and (not isinstance(ref, str) or ref not in accounts):
                out.append(f"{kind}: account {ref!r}")
            elif kind == "clusters" and ref is not None and isinstance(accounts[ref], dict) \
                    and not accounts[ref].get("role_arn") and not accounts[ref].get("aws_conn_id"):
                out.append(f"cluster in {ref} without a role")
    keys = {f"{(accounts.get(c.get('account')) or {}).get('id', 'default') if c.get('account') else 'default'}/"
            f"{c.get('region')}/{c.get('name')}" for c in doc.get("clusters") or [] if isinstance(c, dict)}
    names = [k.split("/")[-1] for k in keys]
    for e in doc.get("endpoints") or []:
        ref = e.get("cluster") if isinstance(e, dict) else None
        if not isinstance(ref, str):
            continue
        parts = ref.split("/")
        if len(parts) == 3:
            account = (accounts.get(parts[0]) or {}).get("id", parts[0]) if isinstance(accounts.get(parts[0]),
                                                                                      dict) else parts[0]
            if f"{account}/{parts[1]}/{parts[2]}" not in keys:
                out.append(f"endpoint cluster {ref!r}")
        elif len(parts) != 1 or ref not in names:
            out.append(f"endpoint cluster {ref!r}")
    return out


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _cases() -> list[tuple[str, str, str, str | None]]:
    base = yaml.safe_load(FLEET.read_text())
    out = []
    for path, values in BAD:
        for i, value in enumerate(values):
            doc = copy.deepcopy(base)
            _set(doc, path, value)
            out.append((f"accounts-bad:{'.'.join(map(str, path))}:{i}", yaml.safe_dump(doc, allow_unicode=True),
                        "refuse", str(path[-1])))
    places = [p for p, _ in BAD] + [("accounts", "retail-prod"), ("accounts",), ("clusters", 0, "account"),
                                    ("lobs", 1, "account"), ("endpoints", 3, "cluster")]
    for seed in SEEDS:
        rng = random.Random(seed)
        doc = copy.deepcopy(base)
        _set(doc, rng.choice(places), rng.choice(SWAPS))
        out.append((f"accounts-swap:{seed}", yaml.safe_dump(doc, allow_unicode=True), "any", None))
    return out


def test_hostile_accounts_are_refused_cleanly_and_naming_the_field(tmp_path: Path) -> None:
    cases, meta = [], {}
    for case_id, text, expect, field in _cases():
        path = tmp_path / f"{len(cases)}.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        cases.append({"id": case_id, "argv": ["validate", "--fleet", str(path)]})
        meta[case_id] = (expect, field, text)
    results = _run(cases, tmp_path)
    failures = [f for case_id, (expect, field, text) in meta.items()
                for f in _check(case_id, results[case_id], expect, field, None)]
    for case_id, (_expect, _field, text) in meta.items():
        result = results[case_id]
        if result["rc"] == 0 and (why := accounts_problems(yaml.safe_load(text))):  # valid by the independent check
            failures.append(f"{case_id}: accepted but invalid: {why}")
        lines = [line for line in result["stderr"].splitlines() if line.startswith("  - ")]
        if result["rc"] == 2 and ("invalid fleet inventory" not in result["stderr"]
                                  or not all(re.match(r"  - [^:]+: \S", line) for line in lines)):
            failures.append(f"{case_id}: a refusal without its problem list, file and path: {result['stderr'][-300:]}")
    assert not failures, "\n".join(failures[:30])
    assert sum(r["rc"] == 2 for r in results.values()) >= sum(len(v) for _, v in BAD)
