"""The `kvfleet_rollout` Params, parsed once per task into a frozen ``RolloutRequest``.

Called by every task body of ``kvfleet.airflow.rollout``; they read the request, never the raw Params. The
defaults and the ranges live in one place, ``kvfleet.airflow.params.rollout_params`` (the trigger form's own
JSON schema): a missing or null key takes its Param's default, and each value is validated against its Param's
schema again here, so a task called with a hand-made conf (``dag.test(run_conf=…)``, the CLI, a test) is held to
the same rules as the form. Bad input is a ``PermanentError`` naming the key, the value and the rule.
Like ``kvfleet.stages.curvine_upgrade.UpgradeRequest`` for the Curvine DAGs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvfleet.errors import PermanentError

# Run-conf keys that are not Params: the AWS connection (run-for-real.md).
EXTRA_CONF_KEYS = frozenset({"aws_conn_id"})
DEFAULT_AWS_CONN_ID = "aws_default"


def _param_specs() -> dict[str, Any]:
    from kvfleet.airflow.params import rollout_params

    return rollout_params()


def refuse_unknown_conf(params: Mapping[str, Any]) -> None:
    """A typo in the run conf (``{"wave_szie": 1}``) must not run a full rollout with the defaults: refuse
    unknown keys before anything changes, naming the known ones."""
    known = set(_param_specs()) | EXTRA_CONF_KEYS
    unknown = sorted(str(k)[:60] for k in params if k not in known)
    if unknown:
        raise PermanentError(f"run conf: unknown key(s) {', '.join(repr(k) for k in unknown[:10])}; the known keys "
                             f"are {', '.join(sorted(known))}. Fix the spelling "
                             "or drop the key; nothing was changed.")


def _resolved(params: Mapping[str, Any]) -> dict[str, Any]:
    """Every Param's value: the conf's when given (and valid under the Param's schema), else the default."""
    from airflow.sdk import Param
    from airflow.sdk.exceptions import ParamValidationError

    out: dict[str, Any] = {}
    for key, spec in _param_specs().items():
        given = params.get(key)
        if given is None:
            out[key] = spec.value
            continue
        try:
            out[key] = Param(given, **spec.schema).resolve()
        except ParamValidationError as exc:
            rule = str(exc).strip().splitlines()[0]
            raise PermanentError(f"run conf: {key}: {given!r:.80} is not valid: {rule}. Give a value the "
                                 f"trigger form accepts ({spec.schema.get('title', key)}); nothing was changed."
                                 ) from exc
    return out


@dataclass(frozen=True)
class RolloutRequest:
    """What one `kvfleet_rollout` run asks for."""

    fleet: str
    lobs: tuple[str, ...]
    clusters: tuple[str, ...]
    endpoints: tuple[str, ...]
    dry_run: bool
    wave_size: int
    max_parallel_clusters: int
    canary: bool
    bake_s: float
    gate: str  # verify | none
    approval: str  # none | after_canary | every_wave
    remediate_drift: bool
    speedup_tolerance: float
    lock_wait_s: float
    prompt_tokens: int
    aws_conn_id: str = DEFAULT_AWS_CONN_ID

    @property
    def gated(self) -> bool:
        """Waves go on only after the verification gate passes."""
        return self.gate == "verify"

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RolloutRequest:
        """Parse the run's Params: unknown keys refused, defaults from ``rollout_params``, values validated."""
        refuse_unknown_conf(params)
        v = _resolved(params)
        return cls(
            fleet=str(v["fleet"]), lobs=tuple(v["lobs"] or ()), clusters=tuple(v["clusters"] or ()),
            endpoints=tuple(v["endpoints"] or ()), dry_run=bool(v["dry_run"]), wave_size=int(v["wave_size"]),
            max_parallel_clusters=int(v["max_parallel_clusters"]), canary=bool(v["canary"]),
            bake_s=float(v["bake_minutes"]) * 60, gate=str(v["gate"]), approval=str(v["approval"]),
            remediate_drift=bool(v["remediate_drift"]), speedup_tolerance=float(v["speedup_tolerance"]),
            lock_wait_s=float(v["lock_wait_minutes"]) * 60, prompt_tokens=int(v["prompt_tokens"]),
            aws_conn_id=str(params.get("aws_conn_id") or DEFAULT_AWS_CONN_ID))
