"""airflow.request.RolloutRequest: the rollout's Params parsed once, defaults from params.py only, bad values
refused naming key, value and rule; airflow/rollout.py reads the request, never the raw Params."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from kvfleet.airflow import rollout
from kvfleet.airflow.params import rollout_params
from kvfleet.airflow.request import RolloutRequest
from kvfleet.errors import PermanentError


def _defaults() -> dict[str, Any]:
    return {k: p.value for k, p in rollout_params().items()}


def test_missing_or_null_keys_take_the_param_defaults() -> None:
    d = _defaults()
    for conf in ({"fleet": "f.yaml"}, {"fleet": "f.yaml", "wave_size": None, "gate": None}):
        req = RolloutRequest.from_params(conf)
        assert (req.wave_size, req.max_parallel_clusters, req.canary, req.gate, req.approval, req.prompt_tokens,
                req.speedup_tolerance, req.dry_run, req.remediate_drift) == (
            d["wave_size"], d["max_parallel_clusters"], d["canary"], d["gate"], d["approval"], d["prompt_tokens"],
            d["speedup_tolerance"], d["dry_run"], d["remediate_drift"])
        assert req.bake_s == d["bake_minutes"] * 60 and req.lock_wait_s == d["lock_wait_minutes"] * 60
        assert (req.lobs, req.clusters, req.endpoints, req.aws_conn_id) == ((), (), (), "aws_default")


def test_given_values_are_kept_and_typed() -> None:
    req = RolloutRequest.from_params({**_defaults(), "fleet": "f.yaml", "clusters": ["c-1"], "wave_size": 7,
                                      "bake_minutes": 1.5, "gate": "none", "lock_wait_minutes": 0.02,
                                      "aws_conn_id": "aws_prod"})
    assert req.clusters == ("c-1",) and req.wave_size == 7 and req.bake_s == 90 and not req.gated
    assert req.lock_wait_s == pytest.approx(1.2) and req.aws_conn_id == "aws_prod"
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.wave_size = 1  # type: ignore[misc]


@pytest.mark.parametrize(("key", "value", "rule"), [("wave_size", 0, "minimum of 1"),
                                                    ("approval", "sometimes", "is not one of"),
                                                    ("speedup_tolerance", 2, "maximum of 1"),
                                                    ("clusters", ["bad name!"], "does not match")])
def test_a_bad_value_is_refused_naming_key_value_and_rule(key: str, value: Any, rule: str) -> None:
    with pytest.raises(PermanentError) as err:
        RolloutRequest.from_params({"fleet": "f.yaml", key: value})
    text = str(err.value)
    assert text.startswith(f"run conf: {key}: {value!r}") and rule in text and "nothing was changed" in text
    assert "\n" not in text


def test_an_unknown_key_is_refused() -> None:
    with pytest.raises(PermanentError, match="'wave_szie'"):
        RolloutRequest.from_params({"fleet": "f.yaml", "wave_szie": 2})


def test_rollout_reads_the_request_never_the_raw_params() -> None:
    source = Path(rollout.__file__).read_text()
    assert not re.search(r"params\.get\(|params\[", source)
